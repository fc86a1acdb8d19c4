"""``jaxtl lm_eval``: EleutherAI's evaluation harness on a jaxtl model.

  jaxtl lm_eval --model_args=checkpoint=workdirs/clm,max_length=64 \
    --tasks=my_task --include_path=my_tasks/ --batch_size=32

lm-eval's own command line and flags, with the model ``jaxtl``
(:mod:`jaxtl.eval.lm_eval_adapter`) registered and chosen.
"""

from __future__ import annotations

import sys

from lm_eval.__main__ import cli_evaluate

from jaxtl.eval import lm_eval_adapter

OWN_FLAGS = True  # lm-eval parses its own command line, not absl


def main(argv: list[str]) -> None:
  sys.argv = [argv[0], f"--model={lm_eval_adapter.NAME}", *argv[1:]]
  cli_evaluate()
