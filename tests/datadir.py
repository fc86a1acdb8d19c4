"""Where tests find the shared real data, so they can skip cleanly without it."""

from __future__ import annotations

import os
import pathlib

import pytest

_REPO = pathlib.Path(__file__).resolve().parent.parent


def data_dir() -> pathlib.Path | None:
  """Returns $JAXTL_DATA_DIR, else `<repo>/../shared/data`, if it exists."""
  env = os.environ.get("JAXTL_DATA_DIR")
  path = pathlib.Path(env) if env else _REPO.parent / "shared" / "data"
  return path if path.is_dir() else None


def require_data(*parts: str) -> pathlib.Path:
  """Returns the data dir (joined with `parts`), or skips the test."""
  root = data_dir()
  if root is None:
    pytest.skip("real data not available (set JAXTL_DATA_DIR)")
  path = root.joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} not available")
  return path
