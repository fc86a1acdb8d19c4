"""Orbax checkpoints: periodic saves, keep-last-K, automatic resume with fallback.

A checkpoint holds everything needed for an exact resume: the train state
(params, optimizer state, step, bad-step counters), the base RNG key and the
data iterator's position. Orbax writes each step into a temporary directory
and renames it only when complete, so a killed run never leaves a
half-written checkpoint looking like the latest one; if the newest readable
step still fails to restore (a corrupted file), restore falls back to the
previous one and says so.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger(__name__)


def _is_finite_tree(tree: Any) -> bool:
  leaves = [x for x in jax.tree.leaves(tree)
            if hasattr(x, "dtype") and np.issubdtype(x.dtype, np.floating)]
  return all(bool(jax.numpy.isfinite(x).all()) for x in leaves)


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` with jaxtl's item layout."""

  def __init__(self, directory: str | os.PathLike, *, save_every: int,
               keep: int, async_save: bool = True):
    self.directory = os.path.abspath(os.fspath(directory))
    self.save_every = max(int(save_every), 1)
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(int(save_every), 1), max_to_keep=keep,
        create=True, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "extra"))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, extra: dict[str, Any], *,
           force: bool = False) -> bool:
    """Saves when ``step`` is due (or ``force``); never from non-finite params.

    ``extra`` is JSON: the data iterator position and the base RNG.
    """
    if not force and step % self.save_every:
      return False
    if step in self._manager.all_steps():
      return False
    if not _is_finite_tree(state.params):
      raise FloatingPointError(f"refusing to checkpoint step {step}: the "
                               "parameters contain NaN or Inf")
    return self._manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      extra=ocp.args.JsonSave(extra)),
        force=force)

  def restore_latest(self, abstract_state: Any
                     ) -> tuple[Any, dict[str, Any], int] | None:
    """Restores the newest readable checkpoint, or None when there is none.

    ``abstract_state`` (ShapeDtypeStructs with shardings) decides the layout
    the arrays land in, so restore works on any mesh.
    """
    for step in reversed(self.all_steps()):
      try:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                extra=ocp.args.JsonRestore()))
      except Exception as e:  # pylint: disable=broad-except
        log.warning("checkpoint at step %d in %s is unreadable (%s: %s); "
                    "falling back to the previous one", step, self.directory,
                    type(e).__name__, str(e).splitlines()[0][:200])
        continue
      return restored["state"], dict(restored["extra"]), step
    return None

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


# ----------------------------------------------------------------------------
# Transfer: pretrained parameters into a fine-tuning model.


def find_checkpoint(path: str | os.PathLike) -> str:
  """A checkpoint step directory from a workdir, a checkpoints dir or a step dir.

  A workdir or checkpoints directory resolves to its newest step.
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(os.path.join(path, "state")):
    return path
  for root in (os.path.join(path, "checkpoints"), path):
    if os.path.isdir(root):
      steps = [int(n) for n in os.listdir(root) if n.isdigit()
               and os.path.isdir(os.path.join(root, n, "state"))]
      if steps:
        return os.path.join(root, str(max(steps)))
  raise FileNotFoundError(f"no jaxtl checkpoint found at {path} (expected a "
                          "workdir, its checkpoints/ directory, or a step directory)")


BEST_DIR = "best"  # where the loop keeps the selected state of a run


def selected_checkpoint(path: str | os.PathLike) -> str:
  """The checkpoint that is a workdir's model: the selected state in
  ``best/`` when the run kept one (fine-tuning), else the newest one.

  The newest checkpoint of a fine-tuning run is its last epoch, which may
  be worse than the epoch the dev score chose and the test was scored on.
  """
  best = os.path.join(os.path.abspath(os.fspath(path)), BEST_DIR)
  if os.path.isdir(best) and any(n.isdigit() for n in os.listdir(best)):
    return find_checkpoint(best)
  return find_checkpoint(path)


def load_params(path: str | os.PathLike) -> dict[str, Any]:
  """The model parameters (host numpy arrays) of a jaxtl checkpoint.

  Read as numpy, not into the shardings it was saved with, so a checkpoint
  from any topology loads (8 devices' pretraining fine-tuned on one).
  """
  state_dir = epath.Path(find_checkpoint(path)) / "state"
  reader = ocp.PyTreeCheckpointHandler()
  try:
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                            reader.metadata(state_dir))
    return reader.restore(state_dir, args=ocp.args.PyTreeRestore(
        restore_args=as_numpy))["params"]
  finally:
    reader.close()


def _flat_transfer(target: Any, pretrained: Any, prefix: tuple[str, ...], skip: Any
                   ) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[str]]]:
  """(flat target, flat pretrained, report); fails on mismatched shapes."""
  import re  # pylint: disable=g-import-not-at-top
  from flax import traverse_util  # pylint: disable=g-import-not-at-top

  flat_target = traverse_util.flatten_dict(target, sep="/")
  flat_pre = {"/".join((*prefix, k)): v for k, v in
              traverse_util.flatten_dict(pretrained, sep="/").items()}
  skipped = lambda name: any(re.search(p, name) for p in skip)
  mismatched = [f"{name}: model expects {tuple(flat_target[name].shape)}, "
                f"checkpoint has {tuple(value.shape)}"
                for name, value in flat_pre.items()
                if name in flat_target and not skipped(name)
                and tuple(flat_target[name].shape) != tuple(value.shape)]
  if mismatched:
    raise ValueError("pretrained parameters do not fit the model:\n  "
                     + "\n  ".join(mismatched))
  report = {"loaded": [], "discarded": [], "new": []}
  for name in flat_pre:
    report["loaded" if name in flat_target and not skipped(name)
           else "discarded"].append(name)
  report["new"] = sorted(set(flat_target) - set(report["loaded"]))
  return flat_target, flat_pre, report


def transfer_report(target: Any, pretrained: Any, *, prefix: tuple[str, ...] = (),
                    skip: Any = ()) -> dict[str, list[str]]:
  """What :func:`merge_pretrained` would load, discard and leave new, and
  its shape check, without copying any array (``target`` may be abstract)."""
  return _flat_transfer(target, pretrained, prefix, skip)[2]


def merge_pretrained(target: Any, pretrained: Any, *, prefix: tuple[str, ...] = (),
                     skip: Any = ()) -> tuple[Any, dict[str, list[str]]]:
  """Copies every pretrained parameter that ``target`` has (under ``prefix``).

  Returns the merged tree and a report: ``loaded``, ``discarded`` (in the
  checkpoint but not in the model, e.g. the LM head) and ``new`` (in the
  model only, e.g. the classifier: they keep their fresh initialisation).
  Names matching a regex in ``skip`` are not loaded. A parameter present in
  both with different shapes is an error listing every such parameter.
  """
  from flax import traverse_util  # pylint: disable=g-import-not-at-top

  flat_target, flat_pre, report = _flat_transfer(target, pretrained, prefix, skip)
  merged = dict(flat_target)
  for name in report["loaded"]:
    merged[name] = jax.numpy.asarray(flat_pre[name], flat_target[name].dtype)
  return traverse_util.unflatten_dict(merged, sep="/"), report
