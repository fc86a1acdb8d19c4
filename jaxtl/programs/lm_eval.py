"""``jaxtl lm_eval``: EleutherAI's evaluation harness on a jaxtl model.

  jaxtl lm_eval --model_args=checkpoint=workdirs/clm,max_length=64 \
    --tasks=my_task --include_path=my_tasks/ --batch_size=32

lm-eval's own command line and flags, with the model ``jaxtl``
(:mod:`jaxtl.eval.lm_eval_adapter`) registered and chosen. Its other
commands pass through (``jaxtl lm_eval ls tasks``).
"""

from __future__ import annotations

import sys

from lm_eval.__main__ import cli_evaluate

from jaxtl.eval import lm_eval_adapter

OWN_FLAGS = True  # lm-eval parses its own command line, not absl
# lm-eval's commands; with none named, ``run``. (lm-eval inserts it itself
# only when there are two or more arguments: `jaxtl lm_eval` alone failed on
# its own --model.)
COMMANDS = ("run", "ls", "validate")
# Printed above lm-eval's own help, which names its own program and asks for
# the --model that jaxtl fills in.
PREFACE = """\
jaxtl lm_eval: lm-eval's `run` with --model=jaxtl filled in; the flags below are
lm-eval's. The model: --model_args=checkpoint=PATH (a jaxtl workdir or a Hugging
Face folder), optionally with ,max_length=N,max_gen_toks=N,dtype=float32|bfloat16,
tokenizer=PATH. For example:
  jaxtl lm_eval --model_args=checkpoint=runs/clm --tasks=my_task \\
    --include_path=my_tasks/ --batch_size=32
"""


def main(argv: list[str]) -> None:
  args = argv[1:] if argv[1:2] and argv[1] in COMMANDS else ["run", *argv[1:]]
  if args[0] == "run":
    args.insert(1, f"--model={lm_eval_adapter.NAME}")
    if {"-h", "--help"} & set(args):
      print(PREFACE)
  sys.argv = [argv[0], *args]
  cli_evaluate()
