"""A fine-tuning run's training batches, and how each is cut before its
step: packed into shared rows (:mod:`jaxtl.tasks.packing`) or trimmed of
padding to one of a few lengths (:mod:`jaxtl.tasks.padding`)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import numpy as np

from jaxtl.data import batches as batches_lib
from jaxtl.tasks import kinds, packing, padding
from jaxtl.tasks.config import FinetuneConfig


def train_batches(arrays: Mapping[str, np.ndarray], config: FinetuneConfig, side: str,
                  dtype: str, devices: int
                  ) -> tuple[batches_lib.BatchIterator, Callable[[Any], Any]]:
  """The training batches, and what cuts each before its step: packs its
  examples into shared rows (``train.pack``, for a kind with one output
  per example and no micro-batches) or cuts its padding.

  Every batch of the run is known ahead (a pure function of the seed and
  its number), so the shapes are chosen for all of them at once, weighing
  a compile as a model computing in ``dtype`` does
  (:func:`padding.compile_positions`); packed row counts round up to a
  multiple of the ``devices`` a batch is split over. Packed batches are
  drawn so that each fits the same rows where the texts allow
  (:func:`packing.balanced_order`): a run compiles one step.
  """
  t, multiple = config.train, config.train.length_multiple
  ends = padding.row_ends(arrays[f"{side}_segment_ids"])
  width = arrays[f"{side}_segment_ids"].shape[1]
  # A kind that packs draws its batches plainly shuffled, packed or not:
  # micro-batches (which split rows, so are not packed) then see the batches
  # a packed run does, and accumulating gradients changes nothing else.
  shuffled = t.pack and kinds.get(config.task.kind).packs
  packs = shuffled and config.optim.accum_steps == 1
  # Packed: each batch into the same rows, one step shape for the run.
  arrange = (packing.balanced(ends, t.batch_size, width, multiple, devices,
                              np.random.default_rng(config.seed)) if packs else None)
  it = batches_lib.BatchIterator(
      arrays, lambda row, rng: row, batch_size=t.batch_size, seed=config.seed,
      lengths=ends if t.group_by_length and multiple and not shuffled else None,
      arrange=arrange)
  batches = np.concatenate([it.epoch_rows(e) for e in range(t.epochs)])
  cost = padding.compile_positions(dtype=dtype)
  if packs:
    pack, how = packing.packer(ends, batches, side, width, multiple, devices, cost)
    logging.info("packing %s over the run", how)
    return it, pack
  table = (padding.compiled_lengths(ends[batches].max(axis=1), multiple, width, cost)
           if multiple else None)
  return it, lambda batch: padding.trim_padding(batch, side, multiple, table)
