"""Numpy packing and padding into t5x-style feature arrays.

For each feature `f` the row arrays are `f` (token ids), `f_segment_ids`
(1..k for the k examples in a row, 0 for padding) and `f_positions` (restarting
at 0 in each segment). Models use the segment ids to stop attention crossing
example boundaries, so packing costs no quality while wasting far less compute
on padding than one example per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np


def chunk_stream(
  docs: Iterable[np.ndarray],
  length: int,
  *,
  eos_id: int | None,
  drop_remainder: bool = True,
  pad_id: int = 0,
) -> np.ndarray:
  """Concatenate documents and cut the stream into rows of `length`.

  This is the GPT/BERT-style "no padding at all" layout: documents are
  separated only by `eos_id` (appended after each one when given) and may
  straddle rows.

  Args:
    docs: 1-D integer token arrays, in stream order.
    length: row length.
    eos_id: appended after every document, or None for no separator.
    drop_remainder: drop a final partial row; otherwise pad it with
      `pad_id`.
    pad_id: id used to fill the final row when `drop_remainder` is False.

  Returns:
    int32 [N, length].
  """
  blocks = list(chunk_blocks(docs, length, eos_id=eos_id,
                             drop_remainder=drop_remainder, pad_id=pad_id))
  return np.concatenate(blocks) if blocks else np.zeros((0, length), np.int32)


def chunk_blocks(
  docs: Iterable[np.ndarray],
  length: int,
  *,
  eos_id: int | None,
  drop_remainder: bool = True,
  pad_id: int = 0,
  block_tokens: int = 1 << 20,
) -> Iterator[np.ndarray]:
  """`chunk_stream` on an unbounded stream: its rows, in int32 [n, length]
  blocks of about `block_tokens` tokens, holding one block at a time."""
  if length < 1:
    raise ValueError(f"length must be >= 1, got {length!r}.")
  pieces, size = [], 0
  def cut(final: bool) -> np.ndarray:
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    num_full, remainder = divmod(stream.size, length)
    pieces.clear()
    if remainder and final and not drop_remainder:
      stream = np.concatenate(
        [stream, np.full(length - remainder, pad_id, dtype=np.int32)])
      num_full += 1
    elif remainder:
      pieces.append(stream[num_full * length:])
    return stream[:num_full * length].reshape(num_full, length)
  for doc in docs:
    doc = np.asarray(doc, dtype=np.int32).ravel()
    pieces.append(doc)
    if eos_id is not None:
      pieces.append(np.array([eos_id], dtype=np.int32))
    size += doc.size + (eos_id is not None)
    if size >= block_tokens:
      block, size = cut(final=False), 0
      if len(block):
        yield block
  block = cut(final=True)
  if len(block):
    yield block


def pack_blocks(
  docs: Iterable[np.ndarray],
  length: int,
  *,
  pad_id: int = 0,
  block_docs: int = 10_000,
) -> Iterator[dict[str, np.ndarray]]:
  """`pack_sequences` of one feature ("tokens") on an unbounded stream.

  Documents are packed `block_docs` at a time; the documents of a block's
  last row (which later ones might still join) are held back and packed
  with the next block, so the rows are exactly those of packing the whole
  stream at once.

  Yields:
    Blocks of rows: "tokens", "tokens_segment_ids", "tokens_positions".
  """
  held: list[np.ndarray] = []
  def pack(final: bool) -> dict[str, np.ndarray] | None:
    rows = pack_sequences([{"tokens": d} for d in held], {"tokens": length},
                          pad_id=pad_id)
    keep = len(rows["tokens"]) if final else len(rows["tokens"]) - 1
    if not final and keep >= 0:  # hold the open row's documents back
      open_docs = int(rows["tokens_segment_ids"][-1].max())
      real = [d for d in held if np.size(d)]
      held[:] = real[len(real) - open_docs:]
    else:
      held.clear()
    if keep <= 0:
      return None
    return {k: v[:keep] for k, v in rows.items()}
  for doc in docs:
    held.append(np.asarray(doc, dtype=np.int32).ravel())
    if len(held) >= block_docs:
      block = pack(final=False)
      if block is not None:
        yield block
  if held:
    block = pack(final=True)
    if block is not None:
      yield block


def row_positions(shape: tuple[int, int]) -> np.ndarray:
  """Positions 0..L-1 in every row of an [N, L] array (unpacked rows)."""
  return np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape).copy()


def pad_to(seq: np.ndarray, length: int, pad_id: int = 0) -> np.ndarray:
  """Right-pads (or truncates) a 1-D sequence to exactly `length` (int32)."""
  seq = np.asarray(seq, dtype=np.int32).ravel()[:length]
  out = np.full(length, pad_id, dtype=np.int32)
  out[:seq.size] = seq
  return out


def pad_one(seq: np.ndarray, length: int, pad_id: int = 0
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One sequence as `pad_batch` lays out a row: (tokens, segment ids,
  positions), int32, truncated or padded to `length`; `pad_rows` of one."""
  return tuple(a[0] for a in pad_rows(np.asarray(seq).ravel()[None], length, pad_id))


def pad_rows(seqs: np.ndarray, length: int, pad_id: int = 0
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """[B, n] equally long sequences as `pad_batch` lays out rows: (tokens,
  segment ids, positions), [B, length] int32, each truncated or padded to
  `length`. The host pipeline's batched path, without `pad_batch`'s
  per-example work."""
  seqs = np.asarray(seqs, np.int32)
  batch, n = seqs.shape[0], min(seqs.shape[1], length)
  tokens = np.full((batch, length), pad_id, np.int32)
  tokens[:, :n] = seqs[:, :n]
  segments = np.zeros((batch, length), np.int32)
  segments[:, :n] = 1
  positions = np.zeros((batch, length), np.int32)
  positions[:, :n] = np.arange(n)
  return tokens, segments, positions


def _feature_lengths(
  examples: Sequence[Mapping[str, np.ndarray]], lengths: Mapping[str, int]
) -> dict[str, np.ndarray]:
  """Per feature, the length of every example after truncation to its row."""
  out = {}
  for name, max_len in lengths.items():
    if max_len < 1:
      raise ValueError(
        f"lengths[{name!r}] must be >= 1, got {max_len!r}.")
    sizes = []
    for i, ex in enumerate(examples):
      if name not in ex:
        raise ValueError(f"Example {i} has no feature {name!r}.")
      sizes.append(np.asarray(ex[name]).size)
    out[name] = np.minimum(np.asarray(sizes, dtype=np.int64), max_len)
  return out


def _build(
  examples: Sequence[Mapping[str, np.ndarray]],
  lengths: Mapping[str, int],
  sizes: dict[str, np.ndarray],
  rows: np.ndarray,
  segments: np.ndarray,
  offsets: dict[str, np.ndarray],
  num_rows: int,
  pad_id: int,
) -> dict[str, np.ndarray]:
  """Scatters examples into rows given each one's row, segment and offsets."""
  out = {}
  for name, row_len in lengths.items():
    size = sizes[name]
    tokens = np.full((num_rows, row_len), pad_id, dtype=np.int32)
    seg_ids = np.zeros((num_rows, row_len), dtype=np.int32)
    positions = np.zeros((num_rows, row_len), dtype=np.int32)
    total = int(size.sum())
    if total:
      flat = np.concatenate([
        np.asarray(ex[name], dtype=np.int32).ravel()[:n]
        for ex, n in zip(examples, size)
      ])
      # Flat index of token j of example i:
      # rows[i] * row_len + offsets[i] + j.
      starts = np.cumsum(size) - size
      pos = np.arange(total) - np.repeat(starts, size)
      dest = np.repeat(rows * row_len + offsets[name], size) + pos
      tokens.ravel()[dest] = flat
      seg_ids.ravel()[dest] = np.repeat(segments, size)
      positions.ravel()[dest] = pos
    out[name] = tokens
    out[f"{name}_segment_ids"] = seg_ids
    out[f"{name}_positions"] = positions
  return out


def pack_sequences(
  examples: Sequence[Mapping[str, np.ndarray]],
  lengths: Mapping[str, int],
  *,
  pad_id: int = 0,
) -> dict[str, np.ndarray]:
  """Packs variable-length examples into rows, sequentially.

  Examples are placed in order; a new row is opened whenever the next example
  does not fit in the current row for some feature. Compared with first-fit
  over all open rows this wastes slightly more space, but it is deterministic,
  keeps examples in stream order and needs only one open row, so it works on
  an unbounded stream. All features of one example share a row and segment id.

  Every example must have every feature in `lengths` (other keys are ignored).
  Features longer than their row length are truncated to it (the caller counts
  and reports truncation). Examples whose features are all empty are skipped.

  Args:
    examples: each maps feature name -> 1-D int array.
    lengths: row length per feature to pack.
    pad_id: id for padding positions.

  Returns:
    For every feature f: f, f + '_segment_ids', f + '_positions', each int32
    [R, lengths[f]].
  """
  sizes = _feature_lengths(examples, lengths)
  names = list(lengths)
  keep = np.zeros(len(examples), dtype=bool)
  for name in names:
    keep |= sizes[name] > 0
  kept = [ex for ex, k in zip(examples, keep) if k]
  sizes = {name: s[keep] for name, s in sizes.items()}

  n = len(kept)
  rows = np.zeros(n, dtype=np.int64)
  segments = np.zeros(n, dtype=np.int64)
  offsets = {name: np.zeros(n, dtype=np.int64) for name in names}
  fill = {name: 0 for name in names}
  row, segment = -1, 0
  for i in range(n):
    if row < 0 or any(fill[f] + sizes[f][i] > lengths[f] for f in names):
      row, segment = row + 1, 0
      fill = {name: 0 for name in names}
    segment += 1
    rows[i], segments[i] = row, segment
    for name in names:
      offsets[name][i] = fill[name]
      fill[name] += int(sizes[name][i])
  return _build(kept, lengths, sizes, rows, segments, offsets, row + 1,
                  pad_id)


def pad_batch(
  examples: Sequence[Mapping[str, np.ndarray]],
  lengths: Mapping[str, int],
  pad_id: int = 0,
) -> dict[str, np.ndarray]:
  """One example per row, padded/truncated: the unpacked counterpart.

  Returns the same features as `pack_sequences` (segment id 1 on real tokens,
  positions 0..n-1), so models and losses need a single code path. Every
  example gets a row, even an empty one (all padding), so the batch size is
  len(examples).
  """
  sizes = _feature_lengths(examples, lengths)
  n = len(examples)
  zeros = np.zeros(n, dtype=np.int64)
  offsets = {name: zeros for name in lengths}
  return _build(examples, lengths, sizes, np.arange(n), np.ones(n, np.int64),
                  offsets, n, pad_id)
