"""Orbax checkpoints: periodic saves, keep-last-K, automatic resume with fallback.

A checkpoint holds everything needed for an exact resume: the train state
(params, optimizer state, step, bad-step counters), the base RNG key and the
data iterator's position. Orbax writes each step into a temporary directory
and renames it only when complete, so a killed run never leaves a
half-written checkpoint looking like the latest one.

Integrity is verified on restore, not assumed: each save records an exact
fingerprint of every array (:mod:`jaxtl.train.fingerprints`), and a step
that fails to restore, whose arrays no longer match their fingerprints (flipped bytes
restore "successfully" otherwise) or whose parameters are not finite is
moved aside as ``N.corrupt`` (renamed, never deleted) and the previous step
is tried. The recomputed step can then be saved again. When steps exist but
none is readable, :class:`UnreadableCheckpoints` stops the run rather than
retrain silently over a workdir that held one.

A save that cannot be written (a full or read-only disk, lost permissions)
stops the run at once with :class:`~jaxtl.train.storage.SaveFailed`, naming
the folder and the OS error: each save first writes a probe file, so the
common failures happen before Orbax starts its background threads (which
otherwise wait minutes for a step directory that was never made), and a
failure inside the background write is polled every step
(:meth:`Checkpointer.check`) rather than found one save later. The failed
step stays an ``N.orbax-checkpoint-tmp`` directory, which is never taken for
a step.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util

from jaxtl import layout
from jaxtl.train import fingerprints as fingerprints_lib
from jaxtl.train import storage

log = logging.getLogger(__name__)

FINGERPRINTS = "fingerprints"  # the key in a checkpoint's ``extra`` JSON
CORRUPT_SUFFIX = ".corrupt"


class UnreadableCheckpoints(RuntimeError):
  """Checkpoints exist but none restores intact: the run must not start over."""


class CheckpointMismatch(RuntimeError):
  """A checkpoint holds another model or optimizer than the run builds: a
  change of settings, not damage, so it is left where it is."""


def _move_aside(step_dir: str) -> str:
  """Renames a bad step directory so that it is no longer a step (and the
  step can be written again); returns the new name."""
  target, n = step_dir + CORRUPT_SUFFIX, 1
  while os.path.exists(target):
    n += 1
    target = f"{step_dir}{CORRUPT_SUFFIX}{n}"
  if jax.process_index() == 0:
    os.rename(step_dir, target)
  return target


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return lines[0] if lines else ""


def _verify(state: Any, extra: dict[str, Any]) -> str | None:
  """Why a restored checkpoint cannot be trusted, or None. Checkpoints from
  before fingerprints were recorded are checked for finiteness only."""
  expected = extra.pop(FINGERPRINTS, None)
  summary = fingerprints_lib.survey(state)
  if expected is not None:
    bad = fingerprints_lib.mismatches(expected, summary)
    if bad:
      return (f"{len(bad)} array(s) differ from what was saved (fingerprint "
              f"mismatch: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''})")
  if not fingerprints_lib.params_finite(summary):
    return "its parameters contain NaN or Inf"
  return None


# The JSON files Orbax reads to restore a step, besides the array data.
_METADATA_FILES = ("state/_METADATA", "state/array_metadatas/*", "extra/metadata")


def _check_metadata(step_dir: str) -> None:
  """Raises ValueError naming the first of a step's metadata files that is
  not valid JSON.

  Checked before Orbax starts a restore: it reads these files concurrently
  with the array data, and when one fails to decode, it closes its event
  loop while TensorStore's reads are still in flight; each read that ends
  afterwards then prints a "RuntimeError: Event loop is closed" traceback
  (over a hundred for one bad file), burying the cause.
  """
  for pattern in _METADATA_FILES:
    for path in sorted(glob.glob(os.path.join(step_dir, pattern))):
      try:
        with open(path, encoding="utf-8") as f:
          json.load(f)
      except (OSError, ValueError) as e:
        raise ValueError(f"{os.path.relpath(path, step_dir)} is damaged "
                         f"({type(e).__name__}: {_first_line(e)})") from e


def _layout(tree: Any) -> tuple[dict[str, tuple[int, ...]], list[tuple[int, ...]]]:
  """(parameter path -> shape, every leaf's shape sorted): what must agree
  between a checkpoint and the state it restores into. Parameters are
  compared by name; the optimizer state, whose container names Orbax's
  metadata spells differently, by its shapes."""
  params, shapes = {}, []
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    names = [fingerprints_lib.key_name(k) for k in path]
    shape = tuple(getattr(leaf, "shape", ()))
    shapes.append(shape)
    if names[:1] == ["params"]:
      params["/".join(names[1:])] = shape
  return params, sorted(shapes)


def layout_mismatch(saved: Any, abstract_state: Any) -> str | None:
  """Why a checkpoint's arrays (its metadata tree) cannot be the state
  ``abstract_state`` describes, or None when they fit."""
  (old, old_shapes), (new, new_shapes) = _layout(saved), _layout(abstract_state)
  diff = [f"{k}: {old[k] if k in old else 'absent'} there, "
          f"{new[k] if k in new else 'absent'} here"
          for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
  if diff:
    return (f"{len(diff)} parameter(s) differ: {'; '.join(diff[:3])}"
            f"{' ...' if len(diff) > 3 else ''}")
  if old_shapes != new_shapes:
    return (f"the optimizer state differs ({len(old_shapes)} arrays there, "
            f"{len(new_shapes)} here): another scheme, freezing or optimizer")
  return None


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` with jaxtl's item layout."""

  def __init__(self, directory: str | os.PathLike, *, save_every: int,
               keep: int, async_save: bool = True):
    self.directory = os.path.abspath(os.fspath(directory))
    self.save_every = max(int(save_every), 1)
    storage.probe_writable(self.directory)  # now, not at the first save
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(int(save_every), 1), max_to_keep=keep,
        create=True, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "extra"))
    self._failed = False  # a save failed: the failure was raised, the run stops

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
    summary = fingerprints_lib.survey(state)
    if not fingerprints_lib.params_finite(summary):
      raise FloatingPointError(f"refusing to checkpoint step {step}: the "
                               "parameters contain NaN or Inf")
    extra = {**extra, FINGERPRINTS: fingerprints_lib.prints(summary)}
    self.check(wait=True)  # the previous save's (Orbax would wait for it too)
    try:
      storage.probe_writable(self.directory)
    except storage.SaveFailed as e:
      raise self._failure(e.__cause__, step) from e.__cause__
    try:
      return self._manager.save(
          step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        extra=ocp.args.JsonSave(extra)),
          force=force)
    except Exception as e:  # pylint: disable=broad-except
      raise self._failure(e, step) from e

  def check(self, wait: bool = False) -> None:
    """Raises :class:`~jaxtl.train.storage.SaveFailed` when a background
    save has failed (with ``wait``, once the one under way is done).

    Cheap; the loop calls it every step, so a disk that fills during a save
    stops the run at the next step, not at the next save.
    """
    try:
      if wait:
        self._manager.wait_until_finished()
      self._manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._failure(e) from e

  def _failure(self, e: BaseException, step: int | None = None) -> storage.SaveFailed:
    """The error that stops the run: where, why, and what is still there."""
    self._failed = True
    steps = [os.path.basename(d) for d in _step_dirs(self.directory)]
    if not isinstance(e, OSError):  # e.g. TensorStore's: ask the OS instead
      e = storage.write_error(self.directory) or e
    cause = (storage.describe(e) if isinstance(e, OSError)
             else f"{type(e).__name__}: {_first_line(e)}")
    return storage.SaveFailed(
        f"saving the checkpoint{'' if step is None else f' of step {step}'} into "
        f"{self.directory} failed ({cause}). Nothing unfinished is taken for a "
        "checkpoint (a partial step stays N.orbax-checkpoint-tmp); the newest "
        f"complete one is {f'step {steps[0]}' if steps else 'none'}. Free space or "
        "fix permissions, then rerun the same command to resume from there.")

  def restore_latest(self, abstract_state: Any
                     ) -> tuple[Any, dict[str, Any], int] | None:
    """Restores the newest intact checkpoint, or None when there is none.

    ``abstract_state`` (ShapeDtypeStructs with shardings) decides the layout
    the arrays land in, so restore works on any mesh. A step that fails to
    restore or to verify is moved aside with a warning giving the cause, and
    the previous one is tried; when every step fails, raises
    :class:`UnreadableCheckpoints`, and so does every later start while only
    moved-aside steps are left. A step of another model or optimizer raises
    :class:`CheckpointMismatch` and is left as it is.
    """
    problems, steps = [], self.all_steps()
    set_aside = sorted(n for n in os.listdir(self.directory) if CORRUPT_SUFFIX in n)
    if not steps and set_aside:  # an earlier start moved every step aside
      raise UnreadableCheckpoints(
          f"{self.directory} holds only checkpoints an earlier start found damaged "
          f"and moved aside ({', '.join(set_aside)}), so this run cannot resume, and "
          "starting over would overwrite a workdir that held a model. To start "
          f"over, use a new workdir or move {self.directory} away.")
    for step in reversed(steps):
      try:
        restored = self._restore(step, abstract_state)
        state, extra = restored["state"], dict(restored["extra"])
        problem = _verify(state, extra)
      except CheckpointMismatch:
        raise
      except Exception as e:  # pylint: disable=broad-except
        problem = f"{type(e).__name__}: {_first_line(e)}"
      if problem is None:
        return state, extra, step
      moved = _move_aside(os.path.join(self.directory, str(step)))
      self._manager.reload()  # else its rotation later looks for the moved step
      problems.append(f"step {step}: {problem}")
      log.warning("checkpoint at step %d in %s is unusable (%s); moved it to %s%s",
                  step, self.directory, problem, moved,
                  "; trying the previous one" if step != steps[0] else "")
    if problems:
      raise UnreadableCheckpoints(
          f"no checkpoint in {self.directory} restores intact, so this run cannot "
          "resume, and starting over would overwrite a workdir that held one:\n  "
          + "\n  ".join(problems) + "\nThe bad steps were moved aside (*"
          f"{CORRUPT_SUFFIX}). To start over, use a new workdir or move "
          f"{self.directory} away.")
    return None

  def _restore(self, step: int, abstract_state: Any) -> Any:
    """One step's items, after checking its metadata is readable and its
    arrays are those ``abstract_state`` holds (:class:`CheckpointMismatch`
    otherwise: a change of settings is not damage, so nothing is moved)."""
    _check_metadata(os.path.join(self.directory, str(step)))
    mismatch = layout_mismatch(
        _state_metadata(os.path.join(self.directory, str(step))), abstract_state)
    if mismatch:
      raise CheckpointMismatch(
          f"the checkpoint at step {step} in {self.directory} holds another model "
          f"or optimizer than this run builds ({mismatch}); it was left as it is. "
          "Rerun with the settings it was trained with, or pass another --workdir.")
    return self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), extra=ocp.args.JsonRestore()))

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for the last save to be written; raises ``SaveFailed`` if
    it was not. After a failure already raised, returns at once: Orbax's
    background threads may wait minutes for a directory that will not come."""
    if self._failed:
      return
    try:
      self._manager.wait_until_finished()
      self._manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._failure(e) from e
    self._manager.close()


# ----------------------------------------------------------------------------
# Transfer: pretrained parameters into a fine-tuning model.


def _step_dirs(root: str) -> list[str]:
  """The step directories (``N/state``) under ``root``, newest first."""
  if not os.path.isdir(root):
    return []
  steps = [int(n) for n in os.listdir(root)
           if n.isdigit() and os.path.isdir(os.path.join(root, n, "state"))]
  return [os.path.join(root, str(n)) for n in sorted(steps, reverse=True)]


def find_checkpoint(path: str | os.PathLike) -> str:
  """A checkpoint step directory from a workdir, a checkpoints dir or a step dir.

  A workdir or checkpoints directory resolves to its newest step.
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(os.path.join(path, "state")):
    return path
  for root in (layout.checkpoints(path), path):
    steps = _step_dirs(root)
    if steps:
      return steps[0]
  raise FileNotFoundError(f"no jaxtl checkpoint found at {path} (expected a "
                          "workdir, its checkpoints/ directory, or a step directory)")


class NoSelectedModel(FileNotFoundError):
  """A run that keeps a selected state (``best/``) has not chosen one yet."""


def selected_checkpoint(path: str | os.PathLike) -> str:
  """The checkpoint that is a workdir's model: the selected state in
  ``best/`` when the run keeps one (fine-tuning), else the newest one.

  The newest checkpoint of a fine-tuning run is its last epoch, which may
  be worse than the epoch the dev score chose and the test was scored on;
  before its first evaluation it is a state half-way through an epoch,
  which is nobody's model: :class:`NoSelectedModel` says so.
  """
  root = os.path.abspath(os.fspath(path))
  best = layout.best(root)
  if not os.path.isdir(best):
    return find_checkpoint(path)
  if _step_dirs(best):
    return find_checkpoint(best)
  newest = _step_dirs(layout.checkpoints(root))
  raise NoSelectedModel(
      f"{root} has no finished model yet: {best} is empty, since the run stopped "
      "before its first evaluation chose a state"
      + (f" (its newest checkpoint, {newest[0]}, is from the middle of an epoch)"
         if newest else "") + ". Rerun the same training command to finish it.")


def load_selected(path: str | os.PathLike, attempts: int = 3) -> dict[str, Any]:
  """:func:`load_params` of :func:`selected_checkpoint`. A run training
  into the workdir meanwhile may rotate the chosen step away while it is
  read (keep-last-K, a better ``best/``): then the choice is made again,
  rather than the vanished step called damaged."""
  while True:
    chosen = selected_checkpoint(path)
    try:
      return load_params(chosen)
    except UnreadableCheckpoints:
      attempts -= 1
      if os.path.isdir(chosen) or not attempts:
        raise


def _state_metadata(step_dir: str) -> Any:
  """The tree of a step's saved state, as array metadata (shapes, dtypes)."""
  reader = ocp.PyTreeCheckpointHandler()
  try:
    return reader.metadata(epath.Path(step_dir) / "state")
  finally:
    reader.close()


def _read_extra(step_dir: str) -> dict[str, Any]:
  """A step's ``extra`` JSON (what :meth:`Checkpointer.save` was given, with
  the fingerprints); {} for a step saved without one."""
  extra_file = os.path.join(step_dir, "extra", "metadata")
  if not os.path.isfile(extra_file):
    return {}
  with open(extra_file, encoding="utf-8") as f:
    return json.load(f)


def saved_extra(path: str | os.PathLike) -> dict[str, Any]:
  """The ``extra`` JSON of the checkpoint at ``path`` (a step, or the newest
  in a directory of steps): the best state's keeps the evaluation that
  chose it."""
  return _read_extra(find_checkpoint(path))


def _read_params(step_dir: str) -> dict[str, Any]:
  """A step's parameters as numpy arrays, checked against their fingerprints.

  The fingerprints name every parameter, so only those are read: not the
  optimizer's moments (two more copies of the model under AdamW), and not
  Orbax's per-array metadata of the whole state. A 2-layer model's params
  then load in 0.08 s instead of 0.28. Steps saved before fingerprints were
  recorded are read whole, from Orbax's metadata.
  """
  _check_metadata(step_dir)
  extra = _read_extra(step_dir)
  saved = {k: v for k, v in extra.get(FINGERPRINTS, {}).items() if k.startswith("params/")}
  as_numpy = ocp.RestoreArgs(restore_type=np.ndarray)
  if saved:
    wanted = traverse_util.unflatten_dict({tuple(k.split("/")): as_numpy for k in saved})
    args = ocp.args.PyTreeRestore(item=wanted, restore_args=wanted, partial_restore=True)
  else:
    args = ocp.args.PyTreeRestore(restore_args=jax.tree.map(
        lambda _: as_numpy, _state_metadata(step_dir)))
  reader = ocp.PyTreeCheckpointHandler()
  try:
    params = reader.restore(epath.Path(step_dir) / "state", args=args)["params"]
  finally:
    reader.close()
  problem = _verify({"params": params}, {FINGERPRINTS: saved} if FINGERPRINTS in extra else {})
  if problem:
    raise ValueError(problem)
  return params


def load_params(path: str | os.PathLike) -> dict[str, Any]:
  """The model parameters (host numpy arrays) of a jaxtl checkpoint.

  Read as numpy, not into the shardings it was saved with, so a checkpoint
  from any topology loads (8 devices' pretraining fine-tuned on one). Given
  a workdir or checkpoints directory, an unreadable or corrupt newest step
  falls back to the previous one, as resuming does (with a warning); a
  step directory given explicitly must be intact.
  """
  chosen = find_checkpoint(path)
  root = os.path.dirname(chosen)
  explicit = os.path.abspath(os.fspath(path)) == chosen
  steps = [chosen] if explicit else _step_dirs(root)
  problems = []
  for step_dir in steps:
    try:
      return _read_params(step_dir)
    except Exception as e:  # pylint: disable=broad-except
      problems.append(f"{step_dir}: {type(e).__name__}: {_first_line(e)}")
      if step_dir != steps[-1]:
        log.warning("checkpoint %s is unusable (%s); trying the previous one",
                    step_dir, problems[-1])
  raise UnreadableCheckpoints("no intact checkpoint to load parameters from:\n  "
                              + "\n  ".join(problems))


def select_pretrained(target: Any, pretrained: Any, *, prefix: tuple[str, ...] = (),
                      skip: Any = ()) -> tuple[dict[str, Any], dict[str, list[str]]]:
  """The pretrained parameters that ``target`` has (under ``prefix``), by
  "/"-joined path, and a report of them.

  ``target`` may be abstract: nothing is copied. The report lists
  ``loaded`` (the selected ones), ``discarded`` (in the checkpoint but not in
  the model, e.g. the LM head) and ``new`` (in the model only, e.g. the
  classifier: they keep their fresh initialisation). Names matching a regex
  in ``skip`` are not loaded. A parameter present in both with different
  shapes is an error listing every such parameter.
  """
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
  return {name: flat_pre[name] for name in report["loaded"]}, report
