"""Exact fingerprints of a state's arrays, and its finiteness: what a
checkpoint records when it is saved and checks when it is restored, so
flipped bytes that still decode are caught (:mod:`jaxtl.train.checkpoint`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _all_finite(leaves: list[Any]) -> Any:
  return jnp.stack([jnp.isfinite(x).all() for x in leaves]).all()


def is_finite_tree(tree: Any) -> bool:
  """Whether every float in ``tree`` is finite: one compiled reduction over
  the tree. Eagerly, each leaf's shape compiled its own two ops (MiniLM's 85
  leaves: 1.02 s at the first save, 28 ms after; now 0.60 s and 20 ms)."""
  leaves = [x for x in jax.tree.leaves(tree)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
  return not leaves or bool(_all_finite(leaves))


def _fingerprintable(x: Any) -> bool:
  return (hasattr(x, "dtype") and hasattr(x, "shape")
          and (jnp.issubdtype(x.dtype, jnp.number) or x.dtype == np.bool_)
          and np.dtype(x.dtype).itemsize <= 4)


def _as_uint32(x: Any, xp: Any) -> Any:
  """The array's bits as uint32, one element each (16-bit types widened)."""
  width = np.dtype(x.dtype).itemsize
  if x.dtype == np.bool_:
    return x.astype(xp.uint32)
  unsigned = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32}[width]
  bits = (jax.lax.bitcast_convert_type(x, unsigned) if xp is jnp
          else np.ascontiguousarray(x).view(unsigned))
  return bits.astype(xp.uint32)


def _fingerprint(x: Any, xp: Any) -> Any:
  """sum_i bits_i * (2i + 1) mod 2**32 over the flattened array.

  Integer addition mod 2**32 is associative, so the figure is the same on
  any sharding and in numpy; the odd multipliers make any change of one
  element (a flipped bit) change it, and the index in them catches swapped
  elements.
  """
  weights = (xp.arange(x.size, dtype=xp.uint32) * xp.uint32(2) + xp.uint32(1))
  return xp.sum(_as_uint32(x, xp).reshape(-1) * weights, dtype=xp.uint32)


def key_name(key: Any) -> str:
  for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey, SequenceKey
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _named_leaves(tree: Any) -> dict[str, Any]:
  """Arrays by "/"-joined path: ``params/stack/...`` in a TrainState and in
  a ``{"params": ...}`` dict alike."""
  return {"/".join(key_name(k) for k in path): x
          for path, x in jax.tree_util.tree_leaves_with_path(tree) if _fingerprintable(x)}


@jax.jit
def _device_fingerprints(leaves: dict[str, Any]) -> dict[str, Any]:
  return {k: _fingerprint(x, jnp) for k, x in leaves.items()}


def fingerprints(tree: Any) -> dict[str, int]:
  """An exact fingerprint per array of ``tree`` (device arrays, computed where
  they live; numpy arrays on the host), keyed by its path."""
  leaves = _named_leaves(tree)
  if all(isinstance(x, np.ndarray) for x in leaves.values()):
    return {k: int(_fingerprint(x, np)) for k, x in leaves.items()}
  return {k: int(v) for k, v in jax.device_get(_device_fingerprints(leaves)).items()}


def mismatches(expected: dict[str, int], tree: Any, prefix: str = "") -> list[str]:
  """Paths whose fingerprint differs from ``expected`` (restricted to the
  paths under ``prefix`` when the tree is a part of what was saved)."""
  actual = fingerprints(tree)
  wanted = {k[len(prefix):]: v for k, v in expected.items() if k.startswith(prefix)}
  return sorted(k for k in wanted.keys() | actual.keys()
                if wanted.get(k) != actual.get(k))
