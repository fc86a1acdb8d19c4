"""Another checkout's jaxtl in this process: a commit's train step timed
against this one's (``jaxtl benchmark --versus=commit=REV``).

On a small shared host the same program runs 20-35% apart between two
processes, more than most changes are worth (docs: studies/performance),
so a before/after comparison builds both steps in one process and times
them in turns. The other checkout's ``jaxtl`` package is imported under its
own name while this one's modules are set aside, and this one's are put
back after: both programs then live side by side, each closed over its own
modules. The other step is compiled before its modules are set aside
again, so nothing of it imports a module later, when ``jaxtl`` would be
this checkout's once more.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from typing import Iterator

# This checkout: the directory above the jaxtl package (jaxtl/tools/ here).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ours(name: str) -> bool:
  return name == "jaxtl" or name.startswith("jaxtl.")


@contextlib.contextmanager
def imported(root: str, module: str = "jaxtl.tools.benchmark") -> Iterator[types.ModuleType]:
  """``module`` as the checkout at ``root`` (a directory holding a ``jaxtl``
  package) has it; this checkout's modules are back once the block ends."""
  root = os.path.abspath(root)
  if not os.path.isfile(os.path.join(root, "jaxtl", "__init__.py")):
    raise ValueError(f"tree={root}: no jaxtl package there "
                     f"(expected {os.path.join(root, 'jaxtl', '__init__.py')})")
  ours = {name: m for name, m in sys.modules.items() if _ours(name)}
  path = list(sys.path)
  for name in ours:
    del sys.modules[name]
  sys.path.insert(0, root)
  try:
    theirs = __import__(module, fromlist=["_"])
    if not os.path.abspath(theirs.__file__).startswith(root + os.sep):
      raise ValueError(f"tree={root}: {module} came from {theirs.__file__}, not from "
                       "there (an import hook put this checkout first)")
    yield theirs
  finally:
    for name in [n for n in sys.modules if _ours(n)]:
      del sys.modules[name]
    sys.modules.update(ours)
    sys.path[:] = path


@contextlib.contextmanager
def commit_tree(rev: str, repo: str = REPO) -> Iterator[str]:
  """A temporary directory holding the ``jaxtl`` package of commit ``rev``
  of the git repository ``repo`` (this checkout's by default), gone once
  the block ends. Read with ``git archive``: the repository's work tree,
  index and worktree list are left as they were."""
  try:
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", rev, "jaxtl"],
                             capture_output=True, check=False)
  except FileNotFoundError:
    raise ValueError(f"commit={rev}: needs git, which is not installed; check the "
                     "commit out yourself and pass tree=PATH") from None
  if archive.returncode:
    why = archive.stderr.decode(errors="replace").strip().splitlines()
    raise ValueError(f"commit={rev}: git archive in {repo} failed: "
                     f"{why[-1] if why else archive.returncode}")
  with tempfile.TemporaryDirectory(prefix="jaxtl-commit-") as tmp:
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
      tar.extractall(tmp, filter="data")
    yield tmp
