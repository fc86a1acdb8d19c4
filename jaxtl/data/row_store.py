"""A split's rows, tokenized once and kept on disk for random access.

Pretraining reads a corpus as a stream: texts come off their files as they
are consumed (:func:`jaxtl.data.sources.iter_texts`, or the documents of
pre-tokenized shards), are encoded a block at a time (the tokenizer's own
threads encode a block in parallel), and are cut or packed into fixed-length
rows a block at a time (:func:`jaxtl.data.packing.chunk_blocks`,
:func:`~jaxtl.data.packing.pack_blocks`). The rows go to an ArrayRecord file,
one record per row, and the batches read them back by index
(:class:`RowStore`), so neither building nor training holds the corpus in
memory: host memory stays flat as the corpus grows.

  DIR/rows_SPLIT_KEY.array_record   one record per row: int32 tokens, then
                                    (packed rows) int32 segment ids
  DIR/rows_SPLIT_KEY.docs.npy       int64 [rows]: the number of the document
                                    each row's first token belongs to (rows
                                    that mark where documents end)
  DIR/rows_SPLIT_KEY.json           rows, row length, layout, documents,
                                    truncated documents, unigram entropy

The JSON file is written last (and all atomically), so a store without it
is an interrupted build and is built again.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxtl.data import packing

log = logging.getLogger(__name__)

Row = dict[str, np.ndarray]  # "tokens", "segment_ids", "positions": [L]
Rows = dict[str, np.ndarray]  # the same, stacked: [B, L]
_DTYPE = np.dtype("<i4")
ENCODE_BLOCK = 10_000  # texts per tokenizer call
DOCS_SUFFIX = ".docs.npy"


def _array_record():
  try:  # guarded: no array_record wheel for some platforms (Windows); a clear error
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"pretraining rows are kept with array_record: pip install "
                      f"array_record ({e})") from e
  return array_record_module


def encode_stream(texts: Iterable[str], tokenizer: Any,
                  block: int = ENCODE_BLOCK) -> Iterator[np.ndarray]:
  """Token ids of each text (empty ones dropped), ``block`` texts per call
  of the tokenizer's batch encoder."""
  texts = iter(texts)
  while chunk := list(itertools.islice(texts, block)):
    for ids in tokenizer.encode_batch(chunk):
      if ids:
        yield np.asarray(ids, np.int32)


def segment_positions(segment_ids: np.ndarray) -> np.ndarray:
  """Positions restarting at 0 in each segment of packed rows (0 on padding),
  along the last axis: one row [L] or stacked rows [B, L]."""
  segment_ids = np.asarray(segment_ids)
  index = np.arange(segment_ids.shape[-1])
  starts = np.ones(segment_ids.shape, bool)
  starts[..., 1:] = segment_ids[..., 1:] != segment_ids[..., :-1]
  segment_start = np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
  return np.where(segment_ids > 0, index - segment_start, 0).astype(np.int32)


def unigram_entropy(counts: np.ndarray) -> float:
  """Entropy (nats) of the unigram distribution with these token counts.

  A model that ignores context cannot do better than this; pretraining
  should bring the validation loss clearly below it.
  """
  counts = counts.astype(np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def documents_ended(tokens: np.ndarray, segments: np.ndarray | None,
                    eos_id: int | None) -> np.ndarray | None:
  """How many documents each row of a block [n, L] ends, or None when its
  rows do not say (``chunk`` without EOS).

  A ``chunk`` document goes on into the next row until its EOS, so a row
  ends as many as it holds EOS; a ``pack`` row ends all of its segments
  (1..k). Numbering a row's documents from the sum over the rows before it
  gives every document one number, whichever rows it spans.
  """
  if segments is not None:
    return segments.max(axis=1).astype(np.int64)
  if eos_id is None:
    return None
  return (tokens == eos_id).sum(axis=1).astype(np.int64)


def first_documents(ended: np.ndarray) -> np.ndarray:
  """The number of the document each row starts in, from what each ends."""
  return np.concatenate([[0], np.cumsum(ended)[:-1]]).astype(np.int64)


def _save_array(path: str, array: np.ndarray) -> None:
  tmp = f"{path}.{os.getpid()}.tmp.npy"
  np.save(tmp, array)
  os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a store's rows were cut: ``chunk`` (one stream, EOS between
  documents when ``eos_id`` is set) or ``pack`` (documents kept apart by
  segment ids, truncated to a row)."""
  packing: str
  row_length: int
  eos_id: int | None
  pad_id: int

  def rows(self, docs: Iterable[np.ndarray], stats: dict[str, int]
           ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Blocks of ``(tokens, segment_ids or None)``, [n, row_length]."""
    def counted(docs):
      for d in docs:
        stats["documents"] += 1
        stats["truncated"] += len(d) + (self.eos_id is not None) > self.row_length
        yield d
    docs = counted(docs)
    if self.packing == "chunk":
      for tokens in packing.chunk_blocks(docs, self.row_length,
                                         eos_id=self.eos_id):
        yield tokens, None
    elif self.packing == "pack":
      if self.eos_id is not None:
        docs = (np.append(d, self.eos_id).astype(np.int32) for d in docs)
      for block in packing.pack_blocks(docs, self.row_length,
                                       pad_id=self.pad_id):
        yield block["tokens"], block["tokens_segment_ids"]
    else:
      raise ValueError(f"config.data.packing={self.packing!r}; expected chunk or pack")


def build(path: str, docs: Iterable[np.ndarray], layout: Layout, vocab_size: int,
          name: str) -> dict[str, Any]:
  """Writes the rows of ``docs`` to ``path``.array_record (and its .json).

  Returns:
    The metadata written.

  Raises:
    ValueError: when the documents give no complete row (``name`` says
      which split of which source).
  """
  ar = _array_record()
  tmp = f"{path}.{os.getpid()}.tmp"
  writer = ar.ArrayRecordWriter(tmp + ".array_record", "group_size:1")
  counts = np.zeros(vocab_size, np.int64)
  stats = {"documents": 0, "truncated": 0}
  rows, ended = 0, []
  try:
    for tokens, segments in layout.rows(docs, stats):
      real = tokens if segments is None else tokens[segments > 0]
      counts += np.bincount(real.ravel(), minlength=vocab_size)[:vocab_size]
      ended.append(documents_ended(tokens, segments, layout.eos_id))
      for i in range(len(tokens)):
        record = tokens[i].astype(_DTYPE).tobytes()
        if segments is not None:
          record += segments[i].astype(_DTYPE).tobytes()
        writer.write(record)
      rows += len(tokens)
  except BaseException:
    writer.close()
    os.remove(tmp + ".array_record")
    raise
  writer.close()
  if not rows:
    os.remove(tmp + ".array_record")
    raise ValueError(f"{name} gave no complete row of {layout.row_length} tokens")
  if layout.packing == "pack" and stats["truncated"]:
    log.info("%s: %d of %d documents truncated to %d tokens", name,
             stats["truncated"], stats["documents"], layout.row_length)
  meta = {"rows": rows, "layout": dataclasses.asdict(layout), **stats,
          "tokens": int(counts.sum()), "unigram_entropy": unigram_entropy(counts)}
  os.replace(tmp + ".array_record", path + ".array_record")
  if ended[0] is not None:
    _save_array(path + DOCS_SUFFIX, first_documents(np.concatenate(ended)))
  with open(tmp + ".json", "w") as f:
    json.dump(meta, f, indent=1)
  os.replace(tmp + ".json", path + ".json")
  return meta


class RowStore:
  """The rows of one store, read by index (a Grain random-access source).

  The reader is opened on first use in each process, so the store pickles
  into Grain's worker processes without an open file.
  """

  def __init__(self, path: str):
    with open(path + ".json") as f:
      self.meta = json.load(f)
    self.path = path
    self.layout = Layout(**self.meta["layout"])
    self._reader = None
    self._documents = None

  @staticmethod
  def exists(path: str) -> bool:
    return os.path.isfile(path + ".json") and os.path.isfile(path + ".array_record")

  def __len__(self) -> int:
    return self.meta["rows"]

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_reader": None, "_documents": None}

  def _open(self):
    if self._reader is None:
      self._reader = _array_record().ArrayRecordReader(
          self.path + ".array_record", "readahead_buffer_size:0")
    return self._reader

  def take(self, ids: Sequence[int]) -> list[Row]:
    """Rows ``ids``, in that order."""
    return unstack(self.take_stacked(ids))

  def take_stacked(self, ids: Sequence[int]) -> Rows:
    """Rows ``ids``, in that order, stacked: [len(ids), row_length] each."""
    length = self.layout.row_length
    records = self._open().read([int(i) for i in ids])
    values = np.frombuffer(b"".join(records), _DTYPE).astype(np.int32)
    values = values.reshape(len(records), values.size // max(len(records), 1))
    tokens = values[:, :length]
    if values.shape[1] > length:  # packed rows carry their segment ids
      segments = values[:, length:]
      return {"tokens": tokens, "segment_ids": segments,
              "positions": segment_positions(segments)}
    return {"tokens": tokens, "segment_ids": np.ones_like(tokens),
            "positions": packing.row_positions(tokens.shape)}

  def __getitem__(self, i: int) -> Row:
    return self.take([i])[0]

  def first_documents(self) -> np.ndarray:
    """[rows] the number of the document each row's first token belongs to
    (:func:`documents_ended`), read from disk as needed: with it, two rows
    tell whether they hold pieces of the same document.

    A store built before this index existed is read once to make it.

    Raises:
      ValueError: for ``chunk`` rows without EOS (no document boundaries).
    """
    if self._documents is None:
      if self.layout.packing == "chunk" and self.layout.eos_id is None:
        raise ValueError(f"rows {self.path}: chunk rows without EOS do not mark "
                         "where documents end (the objective needs eos=True)")
      file = self.path + DOCS_SUFFIX
      if not os.path.isfile(file):  # a store built before the index existed
        _save_array(file, first_documents(self._documents_ended()))
      self._documents = np.load(file, mmap_mode="r")
    return self._documents

  def _documents_ended(self, block: int = 4096) -> np.ndarray:
    """:func:`documents_ended` of every row, read ``block`` rows at a time."""
    ended = []
    for start in range(0, len(self), block):
      rows = self.take_stacked(range(start, min(start + block, len(self))))
      segments = rows["segment_ids"] if self.layout.packing == "pack" else None
      ended.append(documents_ended(rows["tokens"], segments, self.layout.eos_id))
    return np.concatenate(ended)

  def tokens_array(self) -> np.ndarray:
    """Every row's tokens, [rows, row_length] (for small stores and tests)."""
    return self.take_stacked(range(len(self)))["tokens"]


def stack(rows: Sequence[Mapping[str, np.ndarray]]) -> Rows:
  """Rows (or examples) of one layout -> stacked, [B, ...] per key."""
  return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def unstack(rows: Rows) -> list[Row]:
  """Stacked rows [B, ...] -> B rows."""
  count = len(next(iter(rows.values()))) if rows else 0
  return [{k: v[i] for k, v in rows.items()} for i in range(count)]


class ArrayRows:
  """Rows already in memory (a dict of [N, ...] arrays) with the store's
  interface: fine-tuning features and tests."""

  def __init__(self, rows: dict[str, np.ndarray]):
    self.rows = rows
    self.num_rows = len(next(iter(rows.values())))

  def __len__(self) -> int:
    return self.num_rows

  def take(self, ids: Sequence[int]) -> list[Row]:
    return unstack(self.take_stacked(ids))

  def take_stacked(self, ids: Sequence[int]) -> Rows:
    ids = np.asarray(ids, np.int64)
    return {k: v[ids] for k, v in self.rows.items()}
