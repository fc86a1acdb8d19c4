"""The shipped recipes, for a person at the command line: ``jaxtl recipes``
lists them with one line each, ``jaxtl config RECIPE[:ARGS]`` prints the
config one resolves to, key by key, so a ``--config.KEY=VALUE`` override
can be written without reading the source.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shlex
from typing import Any

from absl import flags
import ml_collections
from ml_collections import config_flags

from jaxtl.runtime import console

# The package jaxtl.configs: the top-level configs/ of a clone (an editable
# install maps it there), or where a wheel put it.
RECIPES_DIR = os.path.dirname(importlib.util.find_spec("jaxtl.configs").origin)
# Modules of configs/ that build recipes but are none.
HELPERS = ("common", "models")


def names() -> list[str]:
  """The recipes' names (``pretrain_clm``), sorted."""
  return sorted(n[:-3] for n in os.listdir(RECIPES_DIR)
                if n.endswith(".py") and not n.startswith("_") and n[:-3] not in HELPERS)


def docstring(name: str) -> str:
  """A recipe's docstring, read from its file (nothing is imported)."""
  with open(os.path.join(RECIPES_DIR, f"{name}.py"), encoding="utf-8") as f:
    return ast.get_docstring(ast.parse(f.read())) or ""


def summary(name: str) -> str:
  """The first sentence of a recipe's docstring."""
  paragraph = " ".join(docstring(name).strip().split("\n\n")[0].split()).replace("``", "")
  return paragraph.split(". ")[0].rstrip(".")


def listing() -> str:
  """Every recipe and its line, aligned; how to see one's keys."""
  width = max(map(len, names()))
  lines = [f"  {n:<{width}}  {summary(n)}" for n in names()]
  return ("recipes (--config=NAME or NAME:ARGS; jaxtl config NAME lists its keys):\n"
          + "\n".join(lines))


def resolve(spec: str) -> str:
  """``spec`` (``--config``'s value) with a shipped recipe's name made into
  its path; raises ValueError when it is neither a file nor a recipe.

  An existing file always wins, so users' own config files work unchanged;
  otherwise ``NAME``, ``NAME.py`` and ``configs/NAME.py`` name the shipped
  ``configs/NAME.py`` (the package ``jaxtl.configs``), ``:ARGS`` kept.
  """
  path, sep, arg = spec.partition(":")
  if os.path.isfile(path):
    return spec
  name = os.path.basename(path)
  name = name[:-3] if name.endswith(".py") else name
  shipped = os.path.join(RECIPES_DIR, f"{name}.py")
  if (os.path.dirname(path) in ("", "configs", "jaxtl/configs") and os.path.isfile(shipped)
      and name not in HELPERS):
    return shipped + sep + arg
  raise ValueError(f"--config={spec}: no such file, and {name!r} is not a shipped "
                   f"recipe (known: {', '.join(names())})")


def load(spec: str) -> Any:
  """The config ``--config=SPEC`` gives (a recipe's name or a config file,
  with ``:ARGS``: ``"finetune_minilm:task=trec"``), read as the commands
  read it: locked, so a misspelt key is an error."""
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
  values(["jaxtl", f"--config={resolve(spec)}"])
  return values.config


# Columns of ``table``: a longer assignment (a list of paths) overflows its
# column rather than pushing every meaning off the screen.
MAX_COLUMN = 48


def _columns(cells: list[tuple[str, ...]]) -> list[str]:
  """Cells aligned in columns at most MAX_COLUMN wide (the last unpadded)."""
  widths = [max((len(c) for c in column if len(c) <= MAX_COLUMN), default=0)
            for column in zip(*cells)]
  return ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1]
          for row in cells]


def table(config: ml_collections.ConfigDict, prefix: str = "") -> str:
  """``--config.KEY=VALUE  (type)  meaning`` per key under ``prefix``: what
  the command line overrides, in the form it takes, and what it does."""
  # heavy: the recipes' sections import JAX (~1.5 s), and the CLI imports this
  # module before it tunes the process for JAX (jaxtl.runtime.startup)
  from jaxtl.configs import common  # pylint: disable=g-import-not-at-top
  rows = common.describe(config, strict=False)  # a user's own file may add keys
  picked = [row for row in rows if row[0].startswith(prefix)]
  if not picked:
    sections = sorted({k.split(".")[0] for k, _, _ in rows})
    first = prefix.split(".")[0]
    if first in sections:  # a section's key misspelt: list the section
      raise ValueError(f"--filter={prefix}: no key starts so; --filter={first} lists "
                       "that section's keys")
    close = console.closest(first, sections)
    guess = f" ({close}?)" if close else ""
    raise ValueError(f"--filter={prefix}: no key starts so{guess}; the sections: "
                     f"{', '.join(sections)}")
  return "\n".join(line.rstrip() for line in _columns(
      [(f"--config.{k}={_shell(v)}", f"({type(v).__name__})", meaning)
       for k, v, meaning in picked]))


def _shell(value: Any) -> str:
  """A value as a shell passes it on: a tuple's parentheses and quotes
  inside double quotes, so the line can be copied as it is."""
  text = repr(value)
  if not isinstance(value, (tuple, list, dict)):
    return text
  return f'"{text}"' if not set(text) & set('"$`\\') else shlex.quote(text)
