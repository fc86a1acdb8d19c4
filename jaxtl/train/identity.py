"""A workdir's identity: the settings that make its checkpoints the model
they are, recorded at the first start and checked at every later one.

The identity is the mode (pretrain, finetune, study) and what defines the
model and its task: the architecture, the objective, the task's name, kind,
labels and pooling, the adaptation scheme, the tokenizer, ``init_from``.
Each workload names its own keys (``pretrain.identity``,
``finetune.identity``). A start on a workdir that holds checkpoints and
differs in any of them stops before it writes a byte, listing each key old
-> new: resuming would fail on every checkpoint, and a fresh start would
rotate the other run's checkpoints away. Every other setting (steps,
epochs, learning rate, batch size, logging) may change on a resume; the
changes are logged.

The record, ``WORKDIR/identity.json``, holds the identity and the flat
settings of the last accepted start, written whole or not at all, after the
run's own checks passed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from jaxtl import layout
from jaxtl.train import workdir as workdir_lib


def _items(config: Any) -> Iterable[tuple[str, Any]]:
  if dataclasses.is_dataclass(config):  # a typed section (jaxtl.sections)
    return ((f.name, getattr(config, f.name)) for f in dataclasses.fields(config))
  return config.items()


def leaves(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """``("section.key", value)`` for every leaf of a config (a ConfigDict, a
  mapping or a typed section), in order: the one walk of a config's keys."""
  for key, value in _items(config):
    if hasattr(value, "items") or (dataclasses.is_dataclass(value)
                                   and not isinstance(value, type)):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def flatten(config: Any) -> dict[str, Any]:
  """A config as ``{"section.key": value}``, values as JSON has them
  (tuples as lists)."""
  return {k: json.loads(json.dumps(v, default=str)) for k, v in leaves(config)}


def pick(config: Any, keys: Iterable[str], skip: Iterable[str] = ()) -> dict[str, Any]:
  """The flat settings at ``keys`` (a section's name takes all of it),
  without those in ``skip``."""
  flat, skip = flatten(config), set(skip)
  return {k: v for k, v in flat.items()
          if k not in skip and any(k == p or k.startswith(p + ".") for p in keys)}


def _read(workdir: str) -> dict[str, Any] | None:
  path = layout.identity_file(workdir)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise workdir_lib.WorkdirConflict(
        f"{path} is unreadable ({type(e).__name__}: {e}); it records which run "
        f"{workdir} holds. Restore it, or pass another --workdir.") from e


def _recorded_identity(workdir: str) -> dict[str, Any]:
  """The identity a workdir with checkpoints recorded; for one written
  before identities were recorded, what its files say (a task.json: a
  fine-tuning run)."""
  record = _read(workdir)
  if record is not None:
    return record.get("identity", {})
  return {"mode": "finetune" if os.path.isfile(layout.task_file(workdir))
          else "pretrain"}


def _show(key: str) -> str:
  return key if key == "mode" else f"config.{key}"


def check(workdir: str, identity: Mapping[str, Any]) -> None:
  """Raises :class:`jaxtl.train.workdir.WorkdirConflict`, listing each key
  old -> new, when ``workdir`` holds checkpoints of a run whose identity
  differs. Reads only."""
  workdir = os.path.abspath(workdir)
  if not workdir_lib.holds_checkpoints(workdir):
    return
  old = _recorded_identity(workdir)
  if old.get("mode") != identity.get("mode") and "mode" in identity:
    # Another kind of run: most often a pretraining workdir passed as the
    # fine-tuning run's --workdir, where --config.init_from was meant.
    start = (f"; to start from its model: --config.init_from={workdir}"
             if old.get("mode") == "pretrain" and identity["mode"] == "finetune" else "")
    kind = {"pretrain": "pretraining", "finetune": "fine-tuning"}
    raise workdir_lib.WorkdirConflict(
        f"{workdir} holds a {kind.get(old.get('mode'), old.get('mode'))} run's "
        f"checkpoints: pass another --workdir for this "
        f"{kind.get(identity['mode'], identity['mode'])} run{start}")
  # A key the record lacks (one added to jaxtl since) is not a change.
  changed = [f"{_show(k)}: {old[k]!r} -> {identity.get(k)!r}" for k in sorted(old)
             if (k in identity or k == "mode") and old[k] != identity.get(k)]
  if changed:
    raise workdir_lib.WorkdirConflict(
        f"{workdir} holds checkpoints of another run, and nothing in it was "
        f"changed: {'; '.join(changed)}. Pass another --workdir for this run, or "
        f"rerun with the settings {layout.IDENTITY_FILE} records there. (A resume may "
        "change anything else: steps or epochs, learning rate, batch size, logging.)")


def record(workdir: str, identity: Mapping[str, Any], settings: Mapping[str, Any]
           ) -> None:
  """Writes ``identity.json`` (whole or not at all) after logging the
  settings that changed since the last start. Call once the run's checks
  passed, before it writes anything else."""
  path = layout.identity_file(workdir)
  old = _read(workdir)
  if old is not None and workdir_lib.holds_checkpoints(workdir):
    before = old.get("settings", {})
    changed = [f"config.{k}: {before[k]!r} -> {settings[k]!r}"
               for k in sorted(before.keys() & settings.keys()) if before[k] != settings[k]]
    if changed:
      logging.info("resuming with changed settings: %s", "; ".join(changed))
  new = {"identity": dict(identity), "settings": dict(settings)}
  if old == new:
    return
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(new, f, indent=1)
  os.replace(tmp, path)
