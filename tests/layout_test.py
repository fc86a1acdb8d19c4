"""The workdir layout (jaxtl.layout): the paths are the documented ones, and
no other module of jaxtl spells a workdir entry's name.

The names are a format (workdirs trained before must still load), so the
expected paths are written out here literally rather than taken from the
module under test.
"""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

from jaxtl import layout

PACKAGE = pathlib.Path(layout.__file__).resolve().parent

DOCUMENTED = {
    layout.lock_file: ".lock",
    layout.identity_file: "identity.json",
    layout.config_file: "config.txt",
    layout.tokenizer_dir: "tokenizer",
    layout.model_config_file: "model_config.json",
    layout.task_file: "task.json",
    layout.data_cache: "data_cache",
    layout.checkpoints: "checkpoints",
    layout.best: "best",
    layout.metrics_file: "metrics.jsonl",
    layout.tensorboard_dir: "tensorboard",
    layout.results_file: "results.json",
}

# Entry names that are also ordinary words of the code (a config key
# ``data["tokenizer"]``, a flag ``--tokenizer``, the checkpoint's
# ``extra["best"]``): they count only where they build a path.
_WORDS = {"tokenizer", "best"}
_PATH_CALLS = {"join", "Path", "glob", "isdir", "isfile", "exists", "makedirs", "open"}
# Folders that are not workdirs and have a layout of their own, which
# happens to share a name: a pretokenized corpus keeps FOLDER/tokenizer/
# (its own docstring is that format's description).
_OTHER_FOLDERS = {("jaxtl/data/pretokenized.py", "tokenizer")}


@pytest.mark.parametrize("fn", list(DOCUMENTED), ids=lambda fn: fn.__name__)
def test_each_function_gives_its_documented_path(fn):
  assert fn("/runs/w") == f"/runs/w/{DOCUMENTED[fn]}"
  assert fn(pathlib.Path("/runs/w")) == f"/runs/w/{DOCUMENTED[fn]}"  # str, from a Path too
  assert fn("w") == os.path.join("w", DOCUMENTED[fn])


def test_every_entry_has_a_function_and_a_line_in_the_docstring():
  assert sorted(layout.ENTRIES) == sorted(DOCUMENTED.values())
  table = [line.split()[0] for line in layout.__doc__.splitlines()
           if line.startswith("  ") and not line.startswith("   ")]
  assert [name.rstrip("/") for name in table] == list(layout.ENTRIES)


def test_the_layout_imports_nothing_of_jaxtl():
  """Any layer may use it (data, models, train, tasks, tools): it must sit
  below them all."""
  tree = ast.parse((PACKAGE / "layout.py").read_text())
  imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
  imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
  assert not [m for m in imported if m == "jaxtl" or m.startswith("jaxtl.")]


def _docstrings(tree: ast.AST) -> set[int]:
  """The ids of the string statements (docstrings): prose, not paths."""
  return {id(node.value) for node in ast.walk(tree)
          if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _path_words(tree: ast.AST) -> set[int]:
  """The ids of the string constants that build a path: arguments of
  ``os.path.join``, ``Path``, ``glob``, ``open`` ... and operands of ``/``."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
      if name in _PATH_CALLS:
        out.update(id(a) for a in node.args)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
      out.update((id(node.left), id(node.right)))
  return out


def spellings(source: str) -> list[tuple[int, str]]:
  """(line, name) for each workdir entry ``source`` spells as a path or a
  path's part (f-strings included), docstrings aside."""
  tree = ast.parse(source)
  prose, paths = _docstrings(tree), _path_words(tree)
  found = []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
      continue
    if id(node) in prose:
      continue
    parts = node.value.split("/")
    for name in layout.ENTRIES:
      whole = node.value == name and (name not in _WORDS or id(node) in paths)
      if whole or (len(parts) > 1 and name in parts):
        found.append((node.lineno, name))
  return sorted(found)


def test_the_checker_finds_the_old_spellings_and_not_the_words():
  old = '''
import os
def f(workdir, data, extra):
  """Reads workdir/best and the checkpoints/ folder."""
  os.path.join(workdir, "checkpoints")
  open(os.path.join(workdir, "results.json"), "w")
  os.path.join(workdir, "tokenizer")
  pathlib.Path(workdir) / "best"
  glob.glob(f"{workdir}/data_cache/rows_*.json")
  TASK_FILE = "task.json"
  data["tokenizer"], extra.get("best"), {"history": [], "best": None}
  flags.DEFINE_string("tokenizer", "", "Overrides the model's tokenizer/ path.")
  raise ValueError(f"{workdir}: no tokenizer/ here; see its best/ folder")
'''
  assert [name for _, name in spellings(old)] == [
      "checkpoints", "results.json", "tokenizer", "best", "data_cache", "task.json"]


def test_no_module_but_the_layout_spells_a_workdir_entry():
  """One name, one place: a module that needs a workdir path asks
  jaxtl.layout for it (a renamed entry would otherwise be found in one
  module and missed in another)."""
  found = []
  for path in sorted(PACKAGE.rglob("*.py")):
    if path.name == "layout.py" and path.parent == PACKAGE:
      continue
    where = path.relative_to(PACKAGE.parent).as_posix()
    found += [f"{where}:{line}: {name!r}" for line, name in spellings(path.read_text())
              if (where, name) not in _OTHER_FOLDERS]
  assert not found, ("spelled outside jaxtl/layout.py (use its functions):\n  "
                     + "\n  ".join(found))
