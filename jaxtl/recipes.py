"""The shipped recipes, for a person at the command line: ``jaxtl recipes``
lists them with one line each, ``jaxtl config RECIPE[:ARGS]`` prints the
config one resolves to, key by key, so a ``--config.KEY=VALUE`` override
can be written without reading the source.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from typing import Any

# The package jaxtl.configs: the top-level configs/ of a clone (an editable
# install maps it there), or where a wheel put it.
RECIPES_DIR = os.path.dirname(importlib.util.find_spec("jaxtl.configs").origin)
# Modules of configs/ that build recipes but are none.
HELPERS = ("common", "models")


def names() -> list[str]:
  """The recipes' names (``pretrain_clm``), sorted."""
  return sorted(n[:-3] for n in os.listdir(RECIPES_DIR)
                if n.endswith(".py") and not n.startswith("_") and n[:-3] not in HELPERS)


def summary(name: str) -> str:
  """The first sentence of a recipe's docstring."""
  with open(os.path.join(RECIPES_DIR, f"{name}.py"), encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  paragraph = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
  return paragraph.split(". ")[0].rstrip(".")


def listing() -> str:
  """Every recipe and its line, aligned; how to see one's keys."""
  width = max(map(len, names()))
  lines = [f"  {n:<{width}}  {summary(n)}" for n in names()]
  return ("recipes (--config=NAME or NAME:ARGS; jaxtl config NAME lists its keys):\n"
          + "\n".join(lines))


def load(spec: str) -> Any:
  """The config ``--config=SPEC`` gives (a recipe name or a file, with
  ``:ARGS``), read as the commands read it."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
  values(["jaxtl", f"--config={spec}"])
  return values.config


def table(config: Any, prefix: str = "") -> str:
  """``--config.KEY=VALUE  (type)`` per key under ``prefix``: what the
  command line overrides, in the form it takes."""
  from jaxtl.train.identity import leaves  # pylint: disable=g-import-not-at-top
  rows = [(k, v) for k, v in leaves(config) if k.startswith(prefix)]
  if not rows:
    raise ValueError(f"--filter={prefix}: no key starts so; the sections: "
                     f"{', '.join(sorted({k.split('.')[0] for k, _ in leaves(config)}))}")
  width = max(len(f"--config.{k}={v!r}") for k, v in rows)
  return "\n".join(f"{f'--config.{k}={v!r}':<{width}}  ({type(v).__name__})"
                   for k, v in rows)
