"""Batched prediction over a split: what fine-tuning's evaluations and a
loaded model's ``predict`` run (batches trimmed and ordered as in training,
sharded over the mesh, gathered on every process)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import numpy as np

from jaxtl.tasks import packing, padding
from jaxtl.train import metrics, sharding, stopping


def _pad_rows(arrays: Mapping[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Pads to a whole number of batches with zero-weight rows (eval sees all)."""
  n = len(arrays["labels"])
  extra = -n % multiple
  return {k: np.concatenate([v, np.zeros((extra, *v.shape[1:]), v.dtype)])
          for k, v in arrays.items()}


def _packed(arrays: Mapping[str, np.ndarray], batch_size: int, mesh, side: str,
            multiple: int) -> tuple[np.ndarray, Callable[[Any], Any]]:
  """An order of ``arrays``' rows whose batches each pack into the same rows
  (:func:`packing.balanced_order`, drawn alike every time), and what packs
  each batch of rows in that order (the last filled up with empty rows) as
  training does (:func:`packing.packer`)."""
  seg = arrays[f"{side}_segment_ids"]
  ends, devices = padding.row_ends(seg), sharding.batch_devices(mesh)
  rng = np.random.default_rng(0)
  order = packing.balanced(ends, batch_size, seg.shape[1], multiple, devices, rng)(rng)
  ends = np.pad(ends[order], (0, -len(ends) % batch_size))
  return order, packing.packer(ends, np.arange(len(ends)).reshape(-1, batch_size), side,
                               seg.shape[1], multiple, devices,
                               padding.compile_positions())[0]


def predict(eval_fn: Callable, params: Any, arrays: Mapping[str, np.ndarray],
            batch_size: int, mesh, side: str = "encoder", multiple: int = 0,
            desc: str | None = "predict", interruptible: bool = False,
            pack: bool = False) -> np.ndarray:
  """Model outputs (class ids, scores, tag ids or spans) for every row, in order.

  Batches are trimmed as in training; per-token outputs are padded back.
  When trimming (``multiple``), rows are batched longest first, so that a
  batch's rows have similar lengths and little padding, and put back in
  order after; the lengths compiled are chosen for all batches at once, as
  in training (:func:`padding.compiled_lengths`). A large split gets a
  progress bar named ``desc`` on a terminal, cleared when done
  (``desc=None``: none). ``interruptible``: a stop request (SIGTERM,
  Ctrl-C) ends it between batches (:func:`jaxtl.train.stopping.check`).
  ``pack`` (with ``multiple``, for one output per example from an
  ``eval_fn`` that reads packed batches): each batch's examples share rows
  as in training (:mod:`jaxtl.tasks.packing`), the rows batched so that
  every batch fits the same number of packed rows.
  """
  n = len(arrays["labels"])
  order, cut = np.arange(n), lambda batch: batch
  if multiple and pack:
    order, cut = _packed(arrays, batch_size, mesh, side, multiple)
  elif multiple:
    order, table = padding.longest_first(arrays[f"{side}_segment_ids"], batch_size, multiple)
    cut = lambda batch: padding.trim_padding(batch, side, multiple, table)
  if multiple:
    arrays = {k: v[order] for k, v in arrays.items()}
  padded = _pad_rows(arrays, batch_size)
  t = padded[f"{side}_segment_ids"].shape[1]
  outs = []
  starts = range(0, len(padded["labels"]), batch_size)
  for i in metrics.progress_bar(starts, desc=desc or "", unit="batch", leave=False,
                                      enabled=desc is not None and jax.process_index() == 0,
                                      min_total=8):
    if interruptible:
      stopping.check()
    batch = cut({k: v[i:i + batch_size] for k, v in padded.items()})
    out = sharding.gather(eval_fn(params, sharding.shard_whole_batch(batch, mesh)))
    # Per-token outputs (tag ids) are shaped like the per-token weights;
    # class probabilities [B, C] are not, whatever C is.
    if out.shape == batch["label_weights"].shape and out.ndim == 2 and out.shape[1] < t:
      out = np.pad(out, [(0, 0), (0, t - out.shape[1])])
    outs.append(out)
  in_order = np.empty_like(outs[0], shape=(n, *outs[0].shape[1:]))
  in_order[order] = np.concatenate(outs)[:n]
  return in_order
