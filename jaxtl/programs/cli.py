"""The ``jaxtl`` command: one console script, a subcommand per entry point.

  jaxtl pretrain  --config=pretrain_clm --workdir=workdirs/clm
  jaxtl finetune  --config=finetune:task=trec --config.init_from=... --workdir=...
  jaxtl study     --config=transfer_study --workdir=workdirs/study
  jaxtl predict   --workdir=workdirs/trec_full --input=texts.txt --output=out.jsonl
  jaxtl prompt    --checkpoint=workdirs/clm --task=trec,sst2 --shots=0,1,4,8 --out=DIR
  jaxtl lm_eval   --model_args=checkpoint=workdirs/clm --tasks=... (lm-eval's flags)
  jaxtl pretokenize --config=pretrain_mixed --out=DIR
  jaxtl generate | convert | benchmark | analysis  (their own flags)

Every program starts the same way (:func:`start`): the libraries' INFO logs
quieted, the process set up before JAX starts
(:func:`jaxtl.runtime.startup.tune_process`), then the program's module
imported and its ``main`` run under absl with a user's mistake as one line. ``jaxtl --help`` says what
each command does, ``jaxtl recipes`` lists the recipes and ``jaxtl config
RECIPE`` their keys. ``--config`` takes a config file path, or the name of a
recipe shipped in :mod:`jaxtl.configs` (``pretrain_clm``,
``configs/pretrain_clm.py``), optionally with ``:key=value,...``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import re
import sys

from absl import flags

from jaxtl import recipes
from jaxtl.runtime import console, startup

flags.DEFINE_bool("verbose", False, "Also print the libraries' INFO logs "
                  "(TensorFlow, JAX, Orbax, absl) and, for runs, the config.")

@dataclasses.dataclass(frozen=True)
class Command:
  """A subcommand: the program it runs (a module of :mod:`jaxtl.programs`;
  None: answered here), the flags put before the user's, what it does in one
  line for ``jaxtl --help``, whether compiled programs are kept between
  runs (not for the benchmark, whose compile times are a cold start's)."""
  module: str | None
  preset: tuple[str, ...]
  summary: str
  compilation_cache: bool = True


COMMANDS: dict[str, Command] = {
    "pretrain": Command("train", ("--mode=pretrain",),
                        "pretrain a model on text (MLM, causal LM, span, ELECTRA, BART, ...)"),
    "finetune": Command("train", ("--mode=finetune",),
                        "adapt a model to a labeled task: a shipped one or your own files"),
    "study": Command("train", ("--mode=study",),
                     "the transfer study: pretrain two models, adapt them every way"),
    "predict": Command("predict", (), "a fine-tuned model's predictions for a file"),
    "generate": Command("generate", (), "write text with a causal LM, a T5 or a BART"),
    "convert": Command("export", (), "export a model as a Hugging Face folder"),
    "prompt": Command("prompt", (), "zero- and few-shot prompting on tasks"),
    "lm_eval": Command("lm_eval", (),
                       "EleutherAI's lm-evaluation-harness on a jaxtl model"),
    "benchmark": Command("benchmark", (),
                         "time the train step (--torch: against PyTorch)",
                         compilation_cache=False),
    "analysis": Command("analysis", (), "probe layers, draw attention maps"),
    "pretokenize": Command("pretokenize", (),
                           "tokenize a corpus once into shards for pretraining"),
    "recipes": Command(None, (), "list the shipped recipes"),
    "config": Command(None, (), "print a recipe's keys and defaults: jaxtl config "
                      "RECIPE[:ARGS] [--filter=PREFIX]"),
}

# What each training command's help says about its recipes.
MODE_RECIPES = {"pretrain": ("pretrain_", "ulmfit:stage=lm"),
                "finetune": ("finetune", "ulmfit:stage=classifier"),
                "study": ("transfer_study", "")}

def recipe_path(value: str) -> str:
  """A ``--config`` value with a shipped recipe's name made into its path
  (:func:`jaxtl.recipes.resolve`); neither a file nor a recipe: one line."""
  try:
    return recipes.resolve(value)
  except ValueError as e:
    console.exit_mistake(str(e))


def with_recipe_paths(argv: list[str]) -> list[str]:
  """``argv`` with every ``--config=`` value resolved by :func:`recipe_path`."""
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      out[i] = "--config=" + recipe_path(arg[len("--config="):])
    elif arg == "--config" and i + 1 < len(out):
      out[i + 1] = recipe_path(out[i + 1])
  return out


def _version() -> str:
  try:
    return importlib.metadata.version("jaxtl")
  except importlib.metadata.PackageNotFoundError:  # run from a clone, not installed
    return "(not installed)"


def usage() -> str:
  width = max(map(len, COMMANDS))
  return "\n".join(
      [f"usage: jaxtl COMMAND [flags]   (jaxtl {_version()}; jaxtl COMMAND --help: "
       "its flags)", "", "commands:"]
      + [f"  {name:<{width}}  {c.summary}" for name, c in COMMANDS.items()])


def mode_help(command: str) -> str:
  """A training command's own help: its usage, its recipes, where its keys are."""
  prefix, extra = MODE_RECIPES[command]
  names = [n for n in recipes.names() if n.startswith(prefix)] + ([extra] if extra else [])
  return (f"usage: jaxtl {command} --config=RECIPE[:ARGS] --workdir=DIR "
          "[--config.KEY=VALUE ...] [--verbose]\n"
          f"  {COMMANDS[command].summary}\n"
          f"  recipes: {', '.join(names)} (jaxtl recipes; or a config file of your own)\n"
          "  keys: jaxtl config RECIPE[:ARGS] [--filter=PREFIX] (e.g. --config.optim.lr=1e-4)\n"
          "  rerun the same command on the same --workdir to resume; Ctrl-C saves and stops\n"
          "  multi-host: --multiprocess (launch/ has SLURM and TPU scripts)")


def _show_config(args: list[str]) -> None:
  """``jaxtl config RECIPE[:ARGS] [--filter=PREFIX]``."""
  spec = next((a for a in args if not a.startswith("--")), "")
  prefix = next((a.split("=", 1)[1] for a in args if a.startswith("--filter=")), "")
  if not spec:
    console.exit_mistake("usage: jaxtl config RECIPE[:ARGS] [--filter=PREFIX] "
                         "(jaxtl recipes lists them)")
  try:
    print(recipes.table(recipes.load(recipe_path(spec)), prefix))
  except (flags.Error, *console.MISTAKES) as e:  # a recipe's own error, a bad prefix
    console.fail(e)


def run(argv: list[str] | None = None) -> None:
  """The ``jaxtl`` console script."""
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(usage())
    raise SystemExit(0 if len(argv) >= 2 else 2)
  if argv[1] == "--version":
    print(f"jaxtl {_version()}")
    return
  command, rest = argv[1], argv[2:]
  if command not in COMMANDS:
    console.exit_mistake(f"{console.unknown('command', command, COMMANDS)} "
                         "(jaxtl --help says what each does)")
  console.set_program(f"jaxtl {command}")
  if command == "recipes":
    print(recipes.listing())
    return
  if command == "config":
    _show_config(rest)
    return
  if command in MODE_RECIPES and {"-h", "--help", "--helpshort"} & set(rest):
    print(mode_help(command))
    return
  # Recipe names work for every command that takes --config.
  start(COMMANDS[command], [f"jaxtl {command}", *COMMANDS[command].preset,
                            *with_recipe_paths(rest)])


def for_terminal(doc: str | None) -> str | None:
  """A program's docstring as ``--help`` prints it: the Sphinx markup that
  makes it a reference page (``code``, :mod:`name`) taken out, since a
  terminal shows the marks, not what they mean. A module named is left as
  its name: ``python -m pydoc NAME`` reads it."""
  if doc is None:
    return None
  doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
  return re.sub(r"``([^`]+)``", r"\1", doc)


def start(command: Command, argv: list[str]) -> None:
  """Runs ``command``'s program on ``argv`` the way every program starts.

  The program's module is imported only after the process is tuned: XLA
  reads its CPU flags when JAX starts its backend, and the malloc
  restart must come before anything is loaded.
  """
  sys.argv = argv
  console.quiet_libraries(argv)
  startup.tune_process(compilation_cache=command.compilation_cache)
  try:
    program = importlib.import_module(f"jaxtl.programs.{command.module}")
  except ImportError as e:  # an optional package the program needs
    console.fail(e)
  # absl's --help prints the __main__ module's docstring and --helpshort
  # the flags of the module named by argv[0]: the program's.
  sys.modules["__main__"].__doc__ = for_terminal(program.__doc__)
  for flag in flags.FLAGS.get_key_flags_for_module(program.__name__):
    flags.FLAGS.register_key_flag_for_module(argv[0], flag)
  if getattr(program, "OWN_FLAGS", False):  # its own parser; mistakes still one line
    console.one_line_mistakes(program.main)(argv)
  else:
    console.run(program.main)
