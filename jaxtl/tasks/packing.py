"""Packing a sentence-level task batch: its examples share rows.

A fine-tuning batch holds a fixed number of examples (the optimizer's
batch), mostly far shorter than the longest. Cut to its longest text, a
batch still computes on padding, and every length a run cuts to is a step
to compile. Packed, each batch's examples are laid end to end in rows of one
length (first-fit, longest first), and only the number of rows could vary:
a run's batches are drawn so that each fits the same rows
(:func:`balanced_order`), so a step computes on the tokens plus a little
slack and a run compiles one shape. Segment ids keep attention inside each
example and positions restart at each, so the function computed is the one
on unpacked rows; the head reads each example's span (``packed_rows``,
``packed_starts``, ``packed_ends``), so labels and loss stay one per
example.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import numpy as np

from jaxtl.tasks import padding

# What a packed batch adds: per example, its row and its span in the row.
SPANS = ("packed_rows", "packed_starts", "packed_ends")


def spans(batch: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
  """A packed batch's per-example rows and spans (:data:`SPANS`), what
  :class:`~jaxtl.models.heads.TaskModel` takes as ``packed``; None for a
  batch of one example per row."""
  return tuple(batch[k] for k in SPANS) if SPANS[0] in batch else None


def first_fit(lengths: np.ndarray, row_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Per example, the row it goes to and where in it it starts: first-fit,
  longest first, which never takes more than 11/9 of the fewest rows the
  examples fit in, plus one (Dosa 2007)."""
  if len(lengths) and int(np.max(lengths)) > row_len:
    raise ValueError(f"an example of {int(np.max(lengths))} tokens does not fit "
                     f"rows of {row_len}")
  rows, starts, filled = np.zeros(len(lengths), np.int32), np.zeros(len(lengths), np.int32), []
  for i in np.argsort(-np.asarray(lengths), kind="stable"):
    n = int(lengths[i])
    row = next((r for r, used in enumerate(filled) if used + n <= row_len), len(filled))
    if row == len(filled):
      filled.append(0)
    rows[i], starts[i] = row, filled[row]
    filled[row] += n
  return rows, starts


def rows_needed(lengths: np.ndarray, row_len: int) -> int:
  """How many rows :func:`first_fit` packs ``lengths`` into."""
  rows, _ = first_fit(lengths, row_len)
  return int(rows.max(initial=-1)) + 1


def rows_per_batch(lengths: np.ndarray, batches: np.ndarray, row_len: int) -> np.ndarray:
  """The rows each batch packs into; ``batches`` [steps, batch_size] holds
  the examples of every batch of a run, ``lengths`` every example's."""
  return np.array([rows_needed(lengths[b], row_len) for b in batches], np.int64)


# How many batches with room an over-full batch tries, lightest first, for
# examples to swap: enough to find room where the rows allow it, few enough
# that a target of too few rows is given up quickly.
SWAP_CANDIDATES = 8


def row_length(ends: np.ndarray, multiple: int, width: int) -> int:
  """Packed rows' length: the longest text (``ends``), rounded up to
  ``multiple`` (``width`` at most, and without a multiple)."""
  return int(padding.round_up(ends.max(), multiple or width, width))


def _balance(batches: np.ndarray, lengths: np.ndarray, row_len: int, rows: int,
             rng: np.random.Generator, give_up: bool) -> bool:
  """Swaps examples between ``batches`` ([n, batch_size] example numbers,
  changed in place) until each packs into at most ``rows`` rows of
  ``row_len``: a batch that needs more gives its longest examples for the
  shortest one of a batch with room (the lightest in tokens first) as long
  as that batch still fits. Each swap makes the full batch lighter, so this
  ends. Returns whether every batch fits; ``give_up`` stops at the first
  batch that cannot be made to."""
  need = rows_per_batch(lengths, batches, row_len)
  tokens = lengths[batches].sum(axis=1)

  def swap_out(b: int) -> bool:  # one swap that leaves the other batch fitting
    room = np.flatnonzero(need <= rows)
    for c in room[np.argsort(tokens[room], kind="stable")][:SWAP_CANDIDATES]:
      j = int(np.argmin(lengths[batches[c]]))
      for i in np.argsort(-lengths[batches[b]], kind="stable"):
        if lengths[batches[c, j]] >= lengths[batches[b, i]]:
          break
        batches[[b, c], [i, j]] = batches[[c, b], [j, i]]
        if rows_needed(lengths[batches[c]], row_len) <= rows:
          for k in (b, c):
            need[k] = rows_needed(lengths[batches[k]], row_len)
            tokens[k] = lengths[batches[k]].sum()
          return True
        batches[[b, c], [i, j]] = batches[[c, b], [j, i]]
    return False

  fits = True
  for b in rng.permutation(np.flatnonzero(need > rows)):
    while need[b] > rows:
      if not swap_out(b):
        if give_up:
          return False
        fits = False
        break
  return fits


def balanced_order(rng: np.random.Generator, lengths: np.ndarray, batch_size: int,
                   row_len: int, rows: int) -> np.ndarray:
  """A shuffled epoch (an order of all examples) whose runs of
  ``batch_size`` each pack into at most ``rows`` rows of ``row_len``
  where the examples allow.

  The batches of a random permutation differ in how many tokens they
  hold, and each row count a run packs into is a step to compile. Here
  each batch that needs more than ``rows`` swaps examples with batches
  that have room (:func:`_balance`); most batches stay as drawn, so all
  are still random samples of the split, a little more even in length. The
  examples that do not fill a last batch come at the end.
  """
  order = rng.permutation(len(lengths))
  full = len(order) - len(order) % batch_size
  batches = order[:full].reshape(-1, batch_size).copy()
  _balance(batches, np.asarray(lengths), row_len, rows, rng, give_up=False)
  return np.concatenate([batches.ravel(), order[full:]])


def balanced_rows(lengths: np.ndarray, batch_size: int, row_len: int, multiple: int,
                  rng: np.random.Generator) -> int:
  """The fewest rows (a multiple of ``multiple``) into which
  :func:`balanced_order` packs every batch of a trial epoch drawn by
  ``rng``: from the rows the average batch's tokens fill, up to the most
  that the drawn batches need."""
  lengths = np.asarray(lengths)
  full = len(lengths) - len(lengths) % batch_size
  drawn = rng.permutation(len(lengths))[:full].reshape(-1, batch_size)
  step = max(multiple, 1)
  if not full:  # no whole batch to balance
    return step
  most = -(-int(rows_per_batch(lengths, drawn, row_len).max()) // step) * step
  fewest = int(padding.round_up(-(-int(lengths[drawn].sum()) // (len(drawn) * row_len)),
                                step, most))
  return next((rows for rows in range(fewest, most, step)
               if _balance(drawn.copy(), lengths, row_len, rows, rng, give_up=True)),
              most)


def balanced(ends: np.ndarray, batch_size: int, width: int, multiple: int, devices: int,
             rng: np.random.Generator) -> Callable[[np.random.Generator], np.ndarray]:
  """What draws an epoch (generator -> order) whose batches each pack into
  the same rows: :func:`balanced_order` at :func:`row_length` and the rows
  :func:`balanced_rows` picks on a trial epoch drawn by ``rng`` (a multiple
  of the ``devices`` a batch is split over)."""
  row_len = row_length(ends, multiple, width)
  rows = balanced_rows(ends, batch_size, row_len, devices, rng)
  return functools.partial(balanced_order, lengths=ends, batch_size=batch_size,
                           row_len=row_len, rows=rows)


def row_table(needed: np.ndarray, batch_size: int, row_len: int, multiple: int,
              compile_cost: float) -> np.ndarray:
  """The row counts a run's packed batches are given, as a table: entry
  ``k`` is the rows of a batch that packs into ``k``; ``needed``: each
  batch's (:func:`rows_per_batch`).

  The choice weighs a compile against the rows it saves as
  :func:`padding.compiled_lengths` weighs lengths: ``compile_cost`` is in
  positions of a batch row (a ``batch_size``-th of a batch's positions),
  so in rows of ``row_len`` it is ``compile_cost * batch_size / row_len``.
  ``multiple``: row counts round up to it (the devices a batch is split
  over).
  """
  return padding.compiled_lengths(needed, multiple, batch_size,
                                  compile_cost * batch_size / row_len)


def packer(ends: np.ndarray, batches: np.ndarray, side: str, width: int, multiple: int,
           devices: int, compile_cost: float) -> tuple[Callable[[Any], Any], str]:
  """What packs each of a run's ``batches`` ([steps, batch_size] example
  indices; example i's text ends at ``ends[i]``) before its step, and a
  line saying how. Rows are as long as the longest text, rounded up to
  ``multiple`` (``width`` at most, and without a multiple); their counts
  are chosen for all batches at once (:func:`row_table`, weighing a compile
  as ``compile_cost``) and rounded up to the ``devices`` a batch is split
  over."""
  row_len = row_length(ends, multiple, width)
  needed = rows_per_batch(ends, batches, row_len)
  table = row_table(needed, batches.shape[1], row_len, devices, compile_cost)
  how = (f"each batch's {batches.shape[1]} examples into "
         f"{' or '.join(map(str, np.unique(table[needed])))} rows of {row_len} tokens: "
         f"{ends[batches].sum()} tokens in {table[needed].sum() * row_len} positions")
  return functools.partial(pack_batch, side=side, row_len=row_len, table=table), how


def pack_batch(batch: Mapping[str, np.ndarray], side: str, row_len: int,
               table: np.ndarray) -> dict[str, np.ndarray]:
  """A batch of one example per row as packed rows (:func:`first_fit`), as
  many as ``table`` says, plus each example's row and span (:data:`SPANS`).

  Arrays of the input ``side`` ([N, T]) become [rows, row_len]; the rest
  (labels, weights: [N]) stay per example.
  """
  seg = batch[f"{side}_segment_ids"]
  lengths = padding.row_ends(seg)
  rows, starts = first_fit(lengths, row_len)
  n_rows = int(table[int(rows.max(initial=-1)) + 1])
  packed = {k: v for k, v in batch.items() if not k.startswith(f"{side}_")}
  ends = starts + lengths
  for name in ("input_tokens", "token_type_ids", "positions"):
    key = f"{side}_{name}"
    if key not in batch:
      continue
    out = np.zeros((n_rows, row_len), batch[key].dtype)
    for i, (r, s, e) in enumerate(zip(rows, starts, ends)):
      out[r, s:e] = batch[key][i, :e - s]
    packed[key] = out
  # Segments numbered 1.. within each row, in order of their starts.
  order = np.lexsort((starts, rows))
  number = np.empty(len(rows), np.int32)
  number[order] = np.arange(len(rows)) - np.searchsorted(rows[order], rows[order])
  seg_out = np.zeros((n_rows, row_len), np.int32)
  for i, (r, s, e) in enumerate(zip(rows, starts, ends)):
    seg_out[r, s:e] = number[i] + 1
  packed[f"{side}_segment_ids"] = seg_out
  packed.update(zip(SPANS, (rows, starts, ends.astype(np.int32))))
  return packed
