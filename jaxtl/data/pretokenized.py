"""Corpora tokenized once, kept as ArrayRecord shards with their tokenizer.

A big corpus costs its tokenization on every run (and every cache miss);
``jaxtl pretokenize`` does it once and writes a folder that
a run reads as ``config.data.source.kind = "pretokenized"`` with
``data_dir`` = that folder:

  FOLDER/pretokenized.json      what was written: the tokenizer's file and
                                fingerprint, the source, the seed, and per
                                split its shards, documents and tokens
  FOLDER/tokenizer/...          the tokenizer itself
  FOLDER/SPLIT-00000-of-0000N.array_record

Each record is one document's token ids, little-endian int32 (no EOS:
the objective's pipeline adds it as it does for text). Documents keep
their order, a split's shards following one another, so a weighted
mixture written here keeps the draw the recorded seed made.

The ids mean something only under the tokenizer that made them: a run
that reads the shards with another one fails, naming both fingerprints.
A run with no ``data.tokenizer.path`` uses the recorded tokenizer.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxtl.data import row_store
from jaxtl.data.tokenizer_files import get_tokenizer, save_tokenizer
from jaxtl.data.tokenizers import Tokenizer

METADATA = "pretokenized.json"
FORMAT = 1
_DTYPE = np.dtype("<i4")


def _array_record():
  try:  # guarded: no array_record wheel for some platforms (Windows); a clear error
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"pre-tokenized shards need array_record: pip install "
                      f"array_record ({e})") from e
  return array_record_module


def shard_names(split: str, num_shards: int) -> list[str]:
  """``SPLIT-00000-of-0000N.array_record`` for each shard."""
  stem = split.replace("/", "_")
  return [f"{stem}-{i:05d}-of-{num_shards:05d}.array_record"
          for i in range(num_shards)]


Texts = Sequence[str] | Callable[[], Iterable[str]]


def write(folder: str, tokenizer: Tokenizer, splits: Mapping[str, Texts], *,
          num_shards: int = 1, source: Mapping[str, Any] | None = None,
          seed: int = 0, batch: int = 10_000) -> dict[str, Any]:
  """Tokenizes each split's texts into ``num_shards`` shards under ``folder``.

  A split's texts are a list, or a function that streams them (called
  twice: once to count the texts that set the shard bounds, once to write),
  so a corpus larger than memory is written without being held. Texts are
  encoded ``batch`` at a time; documents with no tokens are left out (as
  the text pipeline leaves them out). The metadata file is written last, so
  a folder without it is an interrupted write, never read.

  Returns:
    The metadata written.
  """
  if num_shards < 1:
    raise ValueError(f"num_shards={num_shards}: expected >= 1")
  ar = _array_record()
  os.makedirs(folder, exist_ok=True)
  tok_file = save_tokenizer(tokenizer, os.path.join(folder, "tokenizer"))
  meta: dict[str, Any] = {
      "format": FORMAT, "seed": seed, "source": dict(source or {}),
      "tokenizer": {"file": os.path.relpath(tok_file, folder),
                    "fingerprint": tokenizer.fingerprint(),
                    "vocab_size": tokenizer.vocab_size},
      "splits": {}}
  for split, texts in splits.items():
    count = sum(1 for _ in texts()) if callable(texts) else len(texts)
    stream = iter(texts() if callable(texts) else texts)
    names = shard_names(split, num_shards)
    bounds = np.linspace(0, count, num_shards + 1).astype(int)
    documents = tokens = 0
    for name, lo, hi in zip(names, bounds[:-1], bounds[1:]):
      writer = ar.ArrayRecordWriter(os.path.join(folder, name), "group_size:1")
      for ids in row_store.encode_stream(itertools.islice(stream, hi - lo),
                                         tokenizer, batch):
        writer.write(ids.astype(_DTYPE).tobytes())
        documents, tokens = documents + 1, tokens + len(ids)
      writer.close()
    meta["splits"][split] = {"shards": names, "documents": documents,
                             "tokens": tokens}
  tmp = os.path.join(folder, f"{METADATA}.tmp{os.getpid()}")
  with open(tmp, "w") as f:
    json.dump(meta, f, indent=1, default=str)
  os.replace(tmp, os.path.join(folder, METADATA))
  return meta


def metadata(folder: str) -> dict[str, Any]:
  """The folder's ``pretokenized.json``; errors say how to make one."""
  path = os.path.join(folder, METADATA)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path} not found: source.data_dir of a 'pretokenized' source is a "
        "folder written by jaxtl pretokenize (an interrupted "
        "write has shards but no metadata)")
  with open(path) as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(f"{path}: format {meta.get('format')!r}, this jaxtl reads "
                     f"{FORMAT}; write the shards again")
  return meta


def recorded_tokenizer(folder: str) -> Tokenizer:
  """The tokenizer the shards were written with."""
  return get_tokenizer(os.path.join(folder, metadata(folder)["tokenizer"]["file"]))


def read(folder: str, split: str, tokenizer: Tokenizer) -> list[np.ndarray]:
  """A split's documents, as a list (`iter_docs`)."""
  return list(iter_docs(folder, split, tokenizer))


def iter_docs(folder: str, split: str, tokenizer: Tokenizer) -> Iterator[np.ndarray]:
  """A split's documents (int32 token ids), in the order they were written,
  read shard by shard as they are consumed (the checks run at once).

  Raises:
    ValueError: when ``tokenizer`` is not the recorded one (naming both
      fingerprints and the tokenizer file to use instead), or for an
      unknown split (naming those written).
  """
  meta = metadata(folder)
  recorded = meta["tokenizer"]
  if tokenizer.fingerprint() != recorded["fingerprint"]:
    raise ValueError(
        f"{os.path.join(folder, METADATA)}: the shards were tokenized with "
        f"tokenizer {recorded['fingerprint']} ({os.path.join(folder, recorded['file'])}), "
        f"the run's is {tokenizer.fingerprint()}; set config.data.tokenizer.path "
        "to that file (or leave it empty to use it), or pretokenize again")
  if split not in meta["splits"]:
    raise ValueError(f"{folder}: no split {split!r} pretokenized; it has "
                     f"{sorted(meta['splits'])}")
  return _records(folder, meta["splits"][split]["shards"])


def _records(folder: str, names: Iterable[str]) -> Iterator[np.ndarray]:
  ar = _array_record()
  for name in names:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"shard missing: {path}")
    reader = ar.ArrayRecordReader(path)
    try:
      for i in range(0, reader.num_records(), 4096):
        for record in reader.read(list(range(i, min(i + 4096, reader.num_records())))):
          yield np.frombuffer(record, _DTYPE).astype(np.int32)
    finally:
      reader.close()
