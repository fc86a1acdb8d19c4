"""Host input pipeline: source -> tokens -> rows -> objective -> batches.

Everything here is numpy on the host. A split is tokenized once (and cached),
cut into fixed-length rows, and then served by :class:`BatchIterator`, whose
whole state is ``(epoch, index)``: the epoch's shuffle order and every
example's corruption (MLM mask, noise spans) are pure functions of
``(seed, epoch, example id)``. That makes masking dynamic (a new mask each
epoch), resumable exactly from a checkpointed position, and independent of
how many processes share the batch.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import queue
import threading
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from jaxtl import objectives
from jaxtl.data import mixtures, packing, pretokenized, sources
from jaxtl.data.tokenizer_files import get_tokenizer, save_tokenizer
from jaxtl.data.tokenizers import Tokenizer, train_sentencepiece

log = logging.getLogger(__name__)

Example = dict[str, np.ndarray]
Rows = dict[str, np.ndarray]  # "tokens", "segment_ids", "positions": [N, L]


# ----------------------------------------------------------------------------
# Tokenizer and tokenized rows.


TOKENIZER_DIR = "tokenizer"  # where a run keeps the tokenizer it trained


def workdir_tokenizer(workdir: str) -> Tokenizer:
  """The tokenizer a pretraining run trained (or loaded) into its workdir."""
  folder = os.path.join(workdir, TOKENIZER_DIR)
  models = sorted(glob.glob(os.path.join(folder, "*.model")))
  if models:
    return get_tokenizer(models[0])
  if os.path.isfile(os.path.join(folder, "tokenizer.json")):
    return get_tokenizer(folder)
  raise FileNotFoundError(f"no tokenizer in {folder}; set config.tokenizer_path")


def keep_tokenizer(tok: Tokenizer, workdir: str | None) -> Tokenizer:
  """Copies a given tokenizer into the workdir: it travels with the
  checkpoints, so fine-tuning (or continuing) the run finds it."""
  if workdir is not None:
    save_tokenizer(tok, os.path.join(workdir, TOKENIZER_DIR))
  return tok


def build_tokenizer(data: Mapping[str, Any], workdir: str | None,
                    train_texts: Callable[[], list[str]]) -> Tokenizer:
  """Loads ``data.tokenizer.path`` (else pre-tokenized shards' tokenizer),
  or trains one (cached in the workdir)."""
  spec = data["tokenizer"]
  cache_dir = os.path.join(workdir or ".", TOKENIZER_DIR)
  if spec.get("path"):
    return keep_tokenizer(get_tokenizer(sources.expand_path(spec["path"])), workdir)
  shards = pretokenized_dir(data["source"])
  if shards is not None:  # the shards' own tokenizer
    return keep_tokenizer(pretokenized.recorded_tokenizer(shards), workdir)
  prefix = os.path.join(cache_dir, f"spm_{spec['model_type']}_{spec['vocab_size']}")
  if os.path.exists(prefix + ".model"):
    return get_tokenizer(prefix + ".model")
  # train_sentencepiece makes the folder once the model is trained, so data
  # that cannot be read (or a failed training) leaves no empty tokenizer/.
  texts = train_texts()
  log.info("training a %s sentencepiece model (vocab %d) -> %s.model",
           spec["model_type"], spec["vocab_size"], prefix)
  return train_sentencepiece(texts, prefix, spec["vocab_size"],
                             model_type=spec["model_type"],
                             max_sentences=spec.get("max_sentences", 1_000_000))


def _cache_key(data: Mapping[str, Any], split: str, tokenizer: Tokenizer,
               row_length: int, eos: bool, seed: int = 0) -> str:
  h = hashlib.sha1()
  h.update(json.dumps({k: data[k] for k in ("source", "max_docs", "packing")},
                      sort_keys=True, default=str).encode())
  # eos too: stages of one run may cut the same split for two objectives.
  h.update(f"{split}|{row_length}|{eos}|{tokenizer.fingerprint()}".encode())
  if mixtures.is_weighted(data["source"]):  # its documents depend on the seed
    h.update(f"|seed={seed}".encode())
  shards = pretokenized_dir(data["source"])
  if shards is not None:  # shards written again in the same folder
    h.update(json.dumps(pretokenized.metadata(shards), sort_keys=True).encode())
  return h.hexdigest()[:16]


def tokenized_rows(data: Mapping[str, Any], split: str, tokenizer: Tokenizer,
                   row_length: int, *, eos: bool, cache_dir: str | None,
                   texts: list[str] | None = None, seed: int = 0) -> Rows:
  """The split's documents, tokenized and cut (or packed) into rows.

  ``chunk`` concatenates documents (EOS between them when ``eos``) and cuts
  the stream, GPT/RoBERTa style; ``pack`` keeps documents apart with segment
  ids (truncating any longer than a row). ``seed`` picks a weighted
  mixture's documents (sources.load_texts).
  """
  path = None
  if cache_dir:
    key = _cache_key(data, split, tokenizer, row_length, eos, seed)
    path = os.path.join(cache_dir, f"rows_{split.replace('/', '_')}_{key}.npz")
    if os.path.exists(path):
      with np.load(path) as f:
        return {k: f[k] for k in f.files}
  docs = _documents(data, split, tokenizer, texts, seed)
  if data["packing"] == "chunk":
    tokens = packing.chunk_stream(docs, row_length,
                                  eos_id=tokenizer.eos_id if eos else None)
    rows = {"tokens": tokens, "segment_ids": np.ones_like(tokens),
            "positions": packing.row_positions(tokens.shape)}
  elif data["packing"] == "pack":
    if eos:
      docs = [np.append(d, tokenizer.eos_id).astype(np.int32) for d in docs]
    truncated = sum(len(d) > row_length for d in docs)
    if truncated:
      log.info("%s: %d of %d documents truncated to %d tokens", split,
               truncated, len(docs), row_length)
    packed = packing.pack_sequences([{"tokens": d} for d in docs],
                                    {"tokens": row_length},
                                    pad_id=tokenizer.pad_id)
    rows = {"tokens": packed["tokens"],
            "segment_ids": packed["tokens_segment_ids"],
            "positions": packed["tokens_positions"]}
  else:
    raise ValueError(f"config.data.packing={data['packing']!r}; expected chunk or pack")
  if not len(rows["tokens"]):
    raise ValueError(f"split {split!r} of {data['source']} gave no complete "
                     f"row of {row_length} tokens")
  if path:
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.npz"  # processes may share the workdir
    np.savez(tmp, **rows)
    os.replace(tmp, path)
  return rows


def pretokenized_dir(source: Mapping[str, Any]) -> str | None:
  """The shards folder of a ``pretokenized`` source (None for text kinds)."""
  if source.get("kind") != "pretokenized":
    return None
  if not source.get("data_dir"):
    raise ValueError("config.data.source.data_dir is empty: a 'pretokenized' "
                     "source reads the folder jaxtl.tools.pretokenize wrote")
  return sources.expand_path(source["data_dir"])


def _documents(data: Mapping[str, Any], split: str, tokenizer: Tokenizer,
               texts: list[str] | None, seed: int) -> list[np.ndarray]:
  """The split's first ``max_docs`` documents as token ids: read from
  pre-tokenized shards, or the texts encoded now (empty ones dropped)."""
  folder = pretokenized_dir(data["source"])
  if folder is not None:
    docs = pretokenized.read(folder, split, tokenizer)
    return docs[:data["max_docs"]] if data.get("max_docs") else docs
  if texts is None:
    texts = sources.load_texts(data["source"], split, seed=seed)
  if data.get("max_docs"):
    texts = texts[:data["max_docs"]]
  return [np.asarray(d, np.int32) for d in tokenizer.encode_batch(texts) if d]


def unigram_entropy(rows: Rows, vocab_size: int) -> float:
  """Entropy (nats) of the unigram distribution of real tokens in ``rows``.

  A model that ignores context cannot do better than this; pretraining
  should bring the validation loss clearly below it.
  """
  counts = np.bincount(rows["tokens"][rows["segment_ids"] > 0].ravel(),
                       minlength=vocab_size).astype(np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


# ----------------------------------------------------------------------------
# Rows: objectives (jaxtl.objectives) make one example from each.


def frame_rows(rows: Rows, first_id: int, last_id: int) -> Rows:
  """Adds a first and last token to every row ([CLS] ... [SEP] for BERT)."""
  n = len(rows["tokens"])
  col = lambda v: np.full((n, 1), v, np.int32)
  tokens = np.concatenate([col(first_id), rows["tokens"], col(last_id)], axis=1)
  seg = rows["segment_ids"]
  seg = np.concatenate([seg[:, :1], seg, seg[:, -1:]], axis=1)
  return {"tokens": tokens, "segment_ids": seg,
          "positions": packing.row_positions(tokens.shape)}


# ----------------------------------------------------------------------------
# Batching.


class BatchIterator:
  """Deterministic, resumable batches of examples made from rows.

  Epoch ``e`` visits rows in ``permutation(seed, e)`` (or in order without
  shuffling), ``batch_size`` (global) rows per batch; this process keeps its
  contiguous ``1 / process_count`` share. Example ``i`` of epoch ``e`` is made
  with ``default_rng((seed, e, i))``. A non-empty ``stream`` (a later stage
  of a run) spawns independent generators from the same keys, so a stage
  that reads the same rows as an earlier one does not repeat its order and
  masks; the empty stream draws what the iterator always drew.
  """

  def __init__(self, rows: Rows, make_example: Callable[..., Example], *,
               batch_size: int, seed: int, shuffle: bool = True,
               repeat: bool = True, process_index: int = 0,
               process_count: int = 1, stream: tuple[int, ...] = ()):
    if batch_size % process_count:
      raise ValueError(f"global batch size {batch_size} is not divisible by "
                       f"the {process_count} processes")
    self.rows = rows
    self.num_rows = len(next(iter(rows.values())))
    if self.num_rows < batch_size:
      raise ValueError(f"only {self.num_rows} rows, fewer than one batch of "
                       f"{batch_size}")
    self.make_example = make_example
    self.batch_size, self.seed, self.stream = batch_size, seed, tuple(stream)
    self.shuffle, self.repeat = shuffle, repeat
    self.local = batch_size // process_count
    self.offset = process_index * self.local
    self.batches_per_epoch = self.num_rows // batch_size
    self.epoch, self.index = 0, 0
    self._order_epoch, self._order = -1, None

  def get_state(self) -> dict[str, int]:
    return {"epoch": self.epoch, "index": self.index}

  def set_state(self, state: Mapping[str, int]) -> None:
    self.epoch, self.index = int(state["epoch"]), int(state["index"])

  def _rng(self, *key: int) -> np.random.Generator:
    """``default_rng((seed, *key))``, or its spawn for the stream."""
    return np.random.default_rng(np.random.SeedSequence((self.seed, *key),
                                                        spawn_key=self.stream))

  def _epoch_order(self) -> np.ndarray:
    if self._order_epoch != self.epoch:
      self._order = (self._rng(self.epoch).permutation(self.num_rows)
                     if self.shuffle else np.arange(self.num_rows))
      self._order_epoch = self.epoch
    return self._order

  def __iter__(self) -> Iterator[Example]:
    return self

  def __next__(self) -> Example:
    if self.index >= self.batches_per_epoch:
      if not self.repeat:
        raise StopIteration
      self.epoch, self.index = self.epoch + 1, 0
    start = self.index * self.batch_size + self.offset
    ids = self._epoch_order()[start:start + self.local]
    examples = []
    for i in ids:
      row = {k: v[i] for k, v in self.rows.items()}
      rng = self._rng(self.epoch, int(i))
      examples.append(self.make_example(row, rng))
    self.index += 1
    return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


class Prefetcher:
  """Makes batches in a background thread, ahead of the training step.

  ``get_state`` reports the position of the next batch the *consumer* will
  get, not of the producer, so checkpoints resume exactly.
  """

  def __init__(self, iterator: BatchIterator, size: int = 2):
    self.iterator = iterator
    self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
    self._state = iterator.get_state()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._produce, daemon=True)
    self._thread.start()

  def _produce(self) -> None:
    try:
      while not self._stop.is_set():
        item = next(self.iterator)
        self._queue.put((item, self.iterator.get_state()))
    except StopIteration:
      self._queue.put(None)
    except Exception as e:  # pylint: disable=broad-except
      self._queue.put(e)

  def get_state(self) -> dict[str, int]:
    return dict(self._state)

  def __iter__(self) -> Iterator[Example]:
    return self

  def __next__(self) -> Example:
    item = self._queue.get()
    if item is None:
      raise StopIteration
    if isinstance(item, Exception):
      raise item
    batch, self._state = item
    return batch

  def close(self) -> None:
    self._stop.set()
    while not self._queue.empty():
      self._queue.get_nowait()


class DataSetup:
  """Everything the trainer needs from the data side, built from config.data.

  A given ``tokenizer`` (a pretrained model's, for continued pretraining)
  replaces ``config.data.tokenizer``: none is trained or loaded.
  """

  def __init__(self, config: Any, workdir: str | None, *, process_index: int = 0,
               process_count: int = 1, tokenizer: Tokenizer | None = None):
    data = config.data
    self.objective = objectives.get(config.objective.name)
    self.batch_size, self.seed = data.batch_size, config.seed
    self.process_index, self.process_count = process_index, process_count
    self.train_split, self.eval_split = data.train_split, data.eval_split
    self._texts: dict[str, list[str]] = {}
    self.tokenizer = (self._load_tokenizer(data, workdir) if tokenizer is None else
                      keep_tokenizer(tokenizer, workdir if process_index == 0 else None))
    prepared = self.objective.prepare(self.tokenizer, config.objective, data)
    self.make_example, self.lengths = prepared.make_example, prepared.lengths
    self.max_predictions = prepared.max_predictions
    self._cache_dir = (os.path.join(workdir, "data_cache")
                       if workdir and data.cache else None)
    self._memo: dict[tuple[str, bool], Rows] = {}
    self._rows = {split: self._split_rows(data, split, prepared)
                  for split in (data.train_split, data.eval_split)}
    self._texts.clear()
    self.unigram_entropy = unigram_entropy(self._rows[data.train_split],
                                           self.tokenizer.vocab_size)

  def _split_rows(self, data: Any, split: str, prepared: objectives.Prepared) -> Rows:
    """A split cut for ``prepared``, built once per run (stages that cut the
    same rows share them) and cached on disk."""
    tok = self.tokenizer
    key = (_cache_key(data, split, tok, prepared.row_length, prepared.eos,
                      self.seed),
           prepared.framed)
    if key not in self._memo:
      rows = tokenized_rows(data, split, tok, prepared.row_length, eos=prepared.eos,
                            cache_dir=self._cache_dir, texts=self._texts.get(split),
                            seed=self.seed)
      if prepared.framed:
        first = tok.cls_id if tok.cls_id is not None else tok.bos_id
        last = tok.sep_id if tok.sep_id is not None else tok.eos_id
        rows = frame_rows(rows, first, last)
      self._memo[key] = rows
    return self._memo[key]

  def stage_batches(self, config: Any, stream: tuple[int, ...] = ()
                    ) -> tuple[BatchIterator, objectives.Prepared]:
    """Training batches of ``config.data`` and ``config.objective`` (a
    stage's: the run's with its overrides) with the run's tokenizer, and
    the objective as bound to them (lengths, loss positions)."""
    data = config.data
    prepared = objectives.get(config.objective.name).prepare(
        self.tokenizer, config.objective, data)
    rows = self._split_rows(data, data.train_split, prepared)
    batches = BatchIterator(rows, prepared.make_example, batch_size=data.batch_size,
                            seed=self.seed, process_index=self.process_index,
                            process_count=self.process_count, stream=stream)
    return batches, prepared

  def _load_tokenizer(self, data: Any, workdir: str | None) -> Tokenizer:
    """Process 0 trains (and caches) a tokenizer; the others then load it."""
    train_texts = lambda: self._split_texts(data, data.train_split)
    tokenizer = None
    if self.process_index == 0:
      tokenizer = build_tokenizer(data, workdir, train_texts)
    if self.process_count > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("jaxtl_tokenizer")
    return tokenizer or build_tokenizer(data, workdir, train_texts)

  def _split_texts(self, data: Any, split: str) -> list[str]:
    if split not in self._texts:
      texts = sources.load_texts(data.source, split, seed=self.seed)
      self._texts[split] = texts[:data.max_docs] if data.max_docs else texts
    return self._texts[split]

  def train_iterator(self) -> BatchIterator:
    return BatchIterator(self._rows[self.train_split], self.make_example,
                         batch_size=self.batch_size, seed=self.seed,
                         process_index=self.process_index,
                         process_count=self.process_count)

  def eval_iterator(self, num_batches: int | None = None) -> Iterator[Example]:
    """The same eval batches (and masks) every time it is called."""
    it = BatchIterator(self._rows[self.eval_split], self.make_example,
                       batch_size=self.batch_size, seed=self.seed + 1,
                       shuffle=False, repeat=False,
                       process_index=self.process_index,
                       process_count=self.process_count)
    for i, batch in enumerate(it):
      if num_batches and i >= num_batches:
        return
      yield batch

  def num_rows(self, split: str) -> int:
    return len(self._rows[split]["tokens"])

  def num_tokens(self, split: str) -> int:
    """Token slots in the split's rows (padding of packed rows included)."""
    return int(self._rows[split]["tokens"].size)
