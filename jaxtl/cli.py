"""The ``jaxtl`` command: one console script, a subcommand per entry point.

  jaxtl pretrain  --config=pretrain_clm --workdir=workdirs/clm
  jaxtl finetune  --config=finetune:task=trec --config.init_from=... --workdir=...
  jaxtl study     --config=transfer_study --workdir=workdirs/study
  jaxtl predict   --workdir=workdirs/trec_full --input=texts.txt --output=out.jsonl
  jaxtl prompt    --checkpoint=workdirs/clm --task=trec,sst2 --shots=0,1,4,8 --out=DIR
  jaxtl lm_eval   --model_args=checkpoint=workdirs/clm --tasks=... (lm-eval's flags)
  jaxtl pretokenize --config=pretrain_mixed --out=DIR  (jaxtl.tools.pretokenize)
  jaxtl generate | convert | benchmark | analysis  (their own flags)

Each subcommand runs its module as ``python -m <module>`` would, so the two
spellings take the same flags. ``--config`` takes a config file path, or the
name of a recipe shipped in :mod:`jaxtl.configs` (``pretrain_clm``,
``configs/pretrain_clm.py``), optionally with ``:key=value,...``.
"""

from __future__ import annotations

import os
import runpy
import sys

from jaxtl import console

# subcommand -> (module, arguments put before the user's)
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pretrain": ("jaxtl.main", ("--mode=pretrain",)),
    "finetune": ("jaxtl.main", ("--mode=finetune",)),
    "study": ("jaxtl.main", ("--mode=study",)),
    "generate": ("jaxtl.generate", ()),
    "convert": ("jaxtl.convert", ()),
    "predict": ("jaxtl.predict", ()),
    "prompt": ("jaxtl.eval.few_shot", ()),
    "lm_eval": ("jaxtl.eval.lm_eval_adapter", ("--model=jaxtl",)),
    "benchmark": ("jaxtl.tools.benchmark", ()),
    "analysis": ("jaxtl.tools.analysis", ()),
    "pretokenize": ("jaxtl.tools.pretokenize", ()),
}

RECIPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def recipe_path(value: str) -> str:
  """A ``--config`` value with a shipped recipe's name made into its path.

  An existing file always wins, so users' own config files work unchanged;
  otherwise ``NAME``, ``NAME.py`` and ``configs/NAME.py`` name
  ``jaxtl/configs/NAME.py``.
  """
  path, sep, arg = value.partition(":")
  if os.path.isfile(path):
    return value
  name = os.path.basename(path)
  name = name[:-3] if name.endswith(".py") else name
  shipped = os.path.join(RECIPES_DIR, f"{name}.py")
  if os.path.dirname(path) in ("", "configs", "jaxtl/configs") and os.path.isfile(shipped):
    return shipped + sep + arg
  recipes = sorted(n[:-3] for n in os.listdir(RECIPES_DIR)
                   if n.endswith(".py") and not n.startswith("_"))
  console.exit_mistake(f"--config={value}: no such file, and {name!r} is not a shipped "
                   f"recipe (known: {', '.join(recipes)})")


def with_recipe_paths(argv: list[str]) -> list[str]:
  """``argv`` with every ``--config=`` value resolved by :func:`recipe_path`."""
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      out[i] = "--config=" + recipe_path(arg[len("--config="):])
    elif arg == "--config" and i + 1 < len(out):
      out[i + 1] = recipe_path(out[i + 1])
  return out


def _usage() -> str:
  return ("usage: jaxtl {" + ",".join(COMMANDS) + "} [flags]\n"
          "       jaxtl COMMAND --help  for a command's flags")


def run(argv: list[str] | None = None) -> None:
  """Console-script entry point."""
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    raise SystemExit(0 if len(argv) >= 2 else 2)
  command, rest = argv[1], argv[2:]
  if command not in COMMANDS:
    console.exit_mistake(f"unknown command {command!r}; the commands: "
                         f"{', '.join(COMMANDS)} (jaxtl COMMAND --help for its flags)")
  module, preset = COMMANDS[command]
  # Recipe names work for every command that takes --config (main does
  # this itself too, for python -m jaxtl.main).
  console.set_program(f"jaxtl {command}")
  sys.argv = [f"jaxtl {command}", *preset, *with_recipe_paths(rest)]
  runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  run()
