"""Cutting a task batch's padding, and the lengths a run's batches are cut to.

Task texts are mostly far shorter than ``max_len``; a step's cost grows with
the padded length, and every distinct length is a compiled step. Training,
evaluation and prediction cut their batches here.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np


def row_ends(segment_ids: np.ndarray) -> np.ndarray:
  """Per row, one past its last token (0 for an empty row)."""
  positions = np.arange(1, segment_ids.shape[1] + 1)
  return np.where(segment_ids > 0, positions, 0).max(axis=1, initial=0)


# What compiling one more batch shape costs, in padding: as much as this
# many more positions in each of the batches it would serve. Measured on a
# 2-core EPYC for MiniLM at batch 32: about 12 s to trace and compile a
# step, against 27-38 ms per position of a step; 256 keeps to clear wins.
COMPILE_POSITIONS = 256
# Where a CPU computes in bfloat16 (chosen only where its steps run about
# twice as fast as float32 ones: jaxtl.runtime.xla_cpu.BF16_RULES) a
# position costs about half as much and a compile no less, so a compile is
# worth more positions. On the AMX Xeon (family 6 model 207), a bf16
# fine-tune of 9,000 SST-2 sentences, one epoch at batch 32, trained in
# 95.4 and 100.7 s at 256 (5 lengths) against 81.1 and 81.5 s at 1024 (3),
# alternated, the same accuracy.
BF16_COMPILE_POSITIONS = 1024
# On an accelerator a short batch's step is launch-bound and a compile is
# dear: on an H100, MiniLM's step at 32 x 64 took 5.6 ms (at most 0.09 ms a
# position) against 18.7 s to compile, so a compile is worth 200,000
# positions or more. In a TREC fine-tune there (2026-11-27, bf16) the first
# epoch took 71 s, of which the steps about 2.5: the rest compiled the
# lengths that the CPU's figure keeps.
ACCELERATOR_COMPILE_POSITIONS = 200_000


def compile_positions(backend: str | None = None, dtype: str = "float32") -> float:
  """What a compile is worth in positions for a model computing in
  ``dtype``: :data:`COMPILE_POSITIONS` on a CPU (:data:`BF16_COMPILE_POSITIONS`
  in bfloat16), else the accelerators' figure; ``backend`` defaults to
  JAX's default back end."""
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return ACCELERATOR_COMPILE_POSITIONS
  return BF16_COMPILE_POSITIONS if dtype == "bfloat16" else COMPILE_POSITIONS


def round_up(longest: np.ndarray | int, multiple: int, limit: int) -> np.ndarray:
  """Lengths rounded up to ``multiple`` (at least one), at most ``limit``."""
  return np.minimum(-(-np.maximum(longest, 1) // multiple) * multiple, limit)


def compiled_lengths(longest: np.ndarray, multiple: int, limit: int,
                     compile_cost: float | None = None) -> np.ndarray:
  """The lengths a run's batches are cut to, given each batch's longest row.

  Each length is a compiled step (seconds to trace and compile); padding a
  few batches up to a longer one costs less than compiling their own. Of
  the rounded lengths (:func:`round_up`) the batches need, this keeps the
  set that costs least: ``compile_cost`` per length kept, plus each batch's
  padded length (a step's time grows about linearly with it). A rare
  length (three batches of 40 when one needs 48) then joins the next longer
  one. ``compile_cost`` defaults to the back end's
  (:func:`compile_positions`): on an accelerator a run mostly keeps one
  length. Returns a table: entry ``L`` is the length a batch whose longest
  row has ``L`` tokens is cut to, for ``L`` up to ``limit``.
  """
  if compile_cost is None:
    compile_cost = compile_positions()
  sizes, counts = np.unique(round_up(np.asarray(longest), multiple, limit),
                            return_counts=True)
  served = np.concatenate([[0], np.cumsum(counts)])
  # cost[j], below[j]: the least cost of the j shortest sizes when the
  # j-th is compiled, and how many shorter sizes then have their own.
  cost, below = [0.0] + [np.inf] * len(sizes), [0] * (len(sizes) + 1)
  for j in range(1, len(sizes) + 1):
    for k in range(j):
      c = cost[k] + compile_cost + float(sizes[j - 1]) * (served[j] - served[k])
      if c < cost[j]:
        cost[j], below[j] = c, k
  kept, j = [], len(sizes)
  while j:
    kept.append(int(sizes[j - 1]))
    j = below[j]
  kept = np.array(sorted(kept))
  rounded = round_up(np.arange(limit + 1), multiple, limit)
  at = np.searchsorted(kept, rounded)  # past the longest kept: its own length
  return np.where(at < len(kept), kept[np.minimum(at, len(kept) - 1)], rounded)


def longest_first(segment_ids: np.ndarray, batch_size: int, multiple: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  """How prediction batches rows: their order, longest first (a batch's rows
  then have similar lengths and little padding), and the lengths its
  batches are cut to (:func:`compiled_lengths`, for all of them at once)."""
  ends = row_ends(segment_ids)
  order = np.argsort(-ends, kind="stable")
  return order, compiled_lengths(ends[order][::batch_size], multiple, segment_ids.shape[1])


def trim_padding(batch: Mapping[str, np.ndarray], side: str, multiple: int,
                 table: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Cuts the length axis to the batch's longest row, rounded up to ``multiple``.

  Task texts are mostly far shorter than ``max_len`` (TREC questions: about
  13 WordPiece tokens of 64), and attention and MLP cost grows with the
  padded length. Rounding keeps the number of shapes jit compiles small
  (``max_len / multiple``); a ``table`` (:func:`compiled_lengths`) says the
  length instead. Arrays on the other side (T5's decoder) keep their
  length. ``multiple=0`` turns this off.
  """
  t = batch[f"{side}_segment_ids"].shape[1]
  longest = int(row_ends(batch[f"{side}_segment_ids"]).max(initial=0))
  if not multiple:
    keep = t
  elif table is not None and longest < len(table):
    keep = int(table[longest])
  else:
    keep = int(round_up(longest, multiple, t))
  other = "encoder_" if side == "decoder" else "decoder_"
  return {k: v[:, :keep] if v.ndim >= 2 and v.shape[1] == t and not k.startswith(other)
          else v for k, v in batch.items()}
