"""Host input pipeline: source -> tokens -> rows -> objective -> batches.

Everything here is numpy on the host. A split streams from its files, is
tokenized and cut into fixed-length rows once, into a store on disk
(:mod:`jaxtl.data.row_store`), and is then served by :class:`BatchIterator`
(:mod:`jaxtl.data.batches`, re-exported here), a Grain pipeline whose whole
state is ``(epoch, index)``: the epoch's shuffle order and every example's
corruption (MLM mask, noise spans) are pure functions of ``(seed, epoch,
example id)``. That makes masking dynamic (a new mask each epoch), resumable
exactly from a checkpointed position, and independent of how many processes
share the batch and how many Grain workers make it.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from typing import Callable, Iterable, Iterator

import numpy as np
from jax.experimental import multihost_utils

from jaxtl import layout, objectives
from jaxtl.data import packing, pretokenized, row_store, sources
from jaxtl.data.batches import BatchIterator, Example, Row, Rows
from jaxtl.data.tokenizer_files import get_tokenizer, keep_tokenizer
from jaxtl.data.config import DataConfig
from jaxtl.data.sentencepiece_training import VocabTooLarge, train_sentencepiece
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives import ObjectiveConfig
from jaxtl.pretraining.config import PretrainConfig

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------
# Tokenizer and tokenized rows.


def build_tokenizer(data: DataConfig, workdir: str | None,
                    train_texts: Callable[[], Iterable[str]]) -> Tokenizer:
  """Loads ``data.tokenizer.path`` (else pre-tokenized shards' tokenizer),
  or trains one (cached in the workdir)."""
  spec = data.tokenizer
  cache_dir = layout.tokenizer_dir(workdir or ".")
  if spec.path:
    return keep_tokenizer(get_tokenizer(sources.expand_path(spec.path)), workdir)
  shards = pretokenized_dir(data.source)
  if shards is not None:  # the shards' own tokenizer
    return keep_tokenizer(pretokenized.recorded_tokenizer(shards), workdir)
  prefix = os.path.join(cache_dir, f"spm_{spec.model_type}_{spec.vocab_size}")
  if os.path.exists(prefix + ".model"):
    return get_tokenizer(prefix + ".model")
  # train_sentencepiece makes the folder once the model is trained, so data
  # that cannot be read (or a failed training) leaves no empty tokenizer/.
  texts = train_texts()
  log.info("training a %s sentencepiece model (vocab %d) -> %s.model",
           spec.model_type, spec.vocab_size, prefix)
  try:
    return train_sentencepiece(texts, prefix, spec.vocab_size,
                               model_type=spec.model_type,
                               max_sentences=spec.max_sentences)
  except VocabTooLarge as e:  # a small corpus, e.g. a trial with data.max_docs
    raise ValueError(f"{e}: set --config.data.tokenizer.vocab_size={e.most} or less, "
                     "or train on more text") from e


def _cache_key(data: DataConfig, split: str, tokenizer: Tokenizer,
               row_length: int, eos: bool, seed: int = 0) -> str:
  h = hashlib.sha1()
  h.update(json.dumps({"source": dataclasses.asdict(data.source),
                       "max_docs": data.max_docs, "packing": data.packing},
                      sort_keys=True, default=str).encode())
  # eos too: stages of one run may cut the same split for two objectives.
  h.update(f"{split}|{row_length}|{eos}|{tokenizer.fingerprint()}".encode())
  if sources.is_weighted(data.source):  # its documents depend on the seed
    h.update(f"|seed={seed}".encode())
  shards = pretokenized_dir(data.source)
  if shards is not None:  # shards written again in the same folder
    h.update(json.dumps(pretokenized.metadata(shards), sort_keys=True).encode())
  return h.hexdigest()[:16]


def split_rows(data: DataConfig, split: str, tokenizer: Tokenizer,
               row_length: int, *, eos: bool, cache_dir: str, seed: int = 0
               ) -> row_store.RowStore:
  """The split's documents, tokenized and cut (or packed) into rows on disk.

  ``chunk`` concatenates documents (EOS between them when ``eos``) and cuts
  the stream, GPT/RoBERTa style; ``pack`` keeps documents apart with segment
  ids (truncating any longer than a row). The corpus streams through: the
  store is built once per (corpus, tokenizer, layout) under ``cache_dir``
  and read by index afterwards (jaxtl.data.row_store). ``seed`` picks a
  weighted mixture's documents (sources.iter_texts).
  """
  key = _cache_key(data, split, tokenizer, row_length, eos, seed)
  path = os.path.join(cache_dir, f"rows_{split.replace('/', '_')}_{key}")
  if not row_store.RowStore.exists(path):
    os.makedirs(cache_dir, exist_ok=True)
    row_layout = row_store.Layout(data.packing, row_length,
                                  tokenizer.eos_id if eos else None, tokenizer.pad_id)
    row_store.build(path, _documents(data, split, tokenizer, seed), row_layout,
                    tokenizer.vocab_size, f"split {split!r} of {data.source}")
  return row_store.RowStore(path)


def pretokenized_dir(source: sources.SourceConfig) -> str | None:
  """The shards folder of a ``pretokenized`` source (None for text kinds)."""
  if not isinstance(source, sources.PretokenizedSource):
    return None
  if not source.data_dir:
    raise ValueError("config.data.source.data_dir is empty: a 'pretokenized' "
                     "source reads the folder jaxtl pretokenize wrote")
  return sources.expand_path(source.data_dir)


def _documents(data: DataConfig, split: str, tokenizer: Tokenizer,
               seed: int) -> Iterator[np.ndarray]:
  """The split's first ``max_docs`` documents as token ids, streamed: read
  from pre-tokenized shards, or the texts encoded as they are read (empty
  ones dropped)."""
  folder = pretokenized_dir(data.source)
  if folder is not None:
    docs = pretokenized.iter_docs(folder, split, tokenizer)
  else:
    docs = row_store.encode_stream(
        sources.iter_texts(data.source, split, seed=seed), tokenizer)
  return itertools.islice(docs, data.max_docs or None)


# ----------------------------------------------------------------------------
# Rows: objectives (jaxtl.objectives) make one example from each.


def frame_rows(rows: Rows, first_id: int, last_id: int) -> Rows:
  """Adds a first and last token to stacked rows ([CLS] ... [SEP] for BERT)."""
  tokens, seg = np.asarray(rows["tokens"]), np.asarray(rows["segment_ids"])
  column = lambda value: np.full((tokens.shape[0], 1), value, np.int32)
  tokens = np.concatenate([column(first_id), tokens, column(last_id)], axis=1)
  return {"tokens": tokens.astype(np.int32),
          "segment_ids": np.concatenate([seg[:, :1], seg, seg[:, -1:]],
                                        axis=1).astype(np.int32),
          "positions": packing.row_positions(tokens.shape)}


def frame_row(row: Row, first_id: int, last_id: int) -> Row:
  """:func:`frame_rows` of one row."""
  one = {k: np.asarray(row[k])[None] for k in ("tokens", "segment_ids")}
  return {k: v[0] for k, v in frame_rows(one, first_id, last_id).items()}


@dataclasses.dataclass(frozen=True)
class Framed:
  """``make_example`` (and ``make_batch``) of framed rows: picklable
  (Grain's workers get it)."""
  make_example: Callable[[Row, np.random.Generator], Example]
  first_id: int
  last_id: int
  make_batch: objectives.base.MakeBatch | None = None

  def __call__(self, row: Row, rng: np.random.Generator) -> Example:
    return self.make_example(frame_row(row, self.first_id, self.last_id), rng)

  def batch(self, rows: Rows, rngs: list[np.random.Generator]) -> Example:
    return self.make_batch(frame_rows(rows, self.first_id, self.last_id), rngs)


class DataSetup:
  """Everything the trainer needs from the data side, built from config.data.

  A given ``tokenizer`` (a pretrained model's, for continued pretraining)
  replaces ``config.data.tokenizer``: none is trained or loaded. Rows are
  kept on disk under ``WORKDIR/data_cache`` (a temporary folder, removed at
  exit, without a workdir or with ``data.cache`` off).
  """

  def __init__(self, config: PretrainConfig, workdir: str | None, *,
               process_index: int = 0, process_count: int = 1,
               tokenizer: Tokenizer | None = None):
    data = config.data
    self.objective = objectives.get(config.objective.name)
    self.batch_size, self.seed = data.batch_size, config.seed
    self.workers = data.workers
    if not isinstance(self.workers, int) or self.workers < 0:
      raise ValueError(f"config.data.workers={self.workers!r}: expected a number "
                       "of Grain worker processes >= 0 (0: none)")
    self.process_index, self.process_count = process_index, process_count
    self.train_split, self.eval_split = data.train_split, data.eval_split
    self.tokenizer = (self._load_tokenizer(data, workdir) if tokenizer is None else
                      keep_tokenizer(tokenizer, workdir if process_index == 0 else None))
    prepared = self.objective.prepare(self.tokenizer, config.objective, data)
    self.make_example, self.make_batch = self._framed(prepared)
    self.lengths = prepared.lengths
    self.partners = prepared.partner
    self.max_predictions = prepared.max_predictions
    if workdir and data.cache:
      self._cache_dir = layout.data_cache(workdir)
    else:
      self._cache_dir = tempfile.mkdtemp(prefix="jaxtl-rows-")
      # At exit, not with this object: iterators (and Grain's workers) read it.
      atexit.register(shutil.rmtree, self._cache_dir, ignore_errors=True)
    self._rows = {split: self._split_rows(data, split, prepared)
                  for split in (data.train_split, data.eval_split)}
    self.unigram_entropy = self._rows[data.train_split].meta["unigram_entropy"]

  def _framed(self, prepared: objectives.Prepared
              ) -> tuple[Callable[..., Example], objectives.base.MakeBatch | None]:
    """The objective's ``make_example`` and ``make_batch``, framing rows
    first when it asks."""
    if not prepared.framed:
      return prepared.make_example, prepared.make_batch
    tok = self.tokenizer
    framed = Framed(prepared.make_example,
                    tok.cls_id if tok.cls_id is not None else tok.bos_id,
                    tok.sep_id if tok.sep_id is not None else tok.eos_id,
                    prepared.make_batch)
    return framed, None if prepared.make_batch is None else framed.batch

  def _split_rows(self, data: DataConfig, split: str, prepared: objectives.Prepared
                  ) -> row_store.RowStore:
    """A split cut for ``prepared``, built once (stages that cut the same
    rows share the store)."""
    return split_rows(data, split, self.tokenizer, prepared.row_length,
                      eos=prepared.eos, cache_dir=self._cache_dir, seed=self.seed)

  def stage_batches(self, data: DataConfig, objective: ObjectiveConfig,
                    stream: tuple[int, ...] = ()
                    ) -> tuple[BatchIterator, objectives.Prepared]:
    """Training batches of ``data`` and ``objective`` (a stage's: the run's
    with its overrides) with the run's tokenizer, and the objective as
    bound to them (lengths, loss positions)."""
    prepared = objectives.get(objective.name).prepare(self.tokenizer, objective, data)
    rows = self._split_rows(data, data.train_split, prepared)
    make_example, make_batch = self._framed(prepared)
    batches = BatchIterator(rows, make_example, batch_size=data.batch_size,
                            seed=self.seed, process_index=self.process_index,
                            process_count=self.process_count, stream=stream,
                            workers=data.workers, partners=prepared.partner,
                            make_batch=make_batch)
    return batches, prepared

  def _load_tokenizer(self, data: DataConfig, workdir: str | None) -> Tokenizer:
    """Process 0 trains (and caches) a tokenizer; the others then load it."""
    train_texts = lambda: self._split_texts(data, data.train_split)
    tokenizer = None
    if self.process_index == 0:
      tokenizer = build_tokenizer(data, workdir, train_texts)
    if self.process_count > 1:
      multihost_utils.sync_global_devices("jaxtl_tokenizer")
    return tokenizer or build_tokenizer(data, workdir, train_texts)

  def _split_texts(self, data: DataConfig, split: str) -> Iterator[str]:
    texts = sources.iter_texts(data.source, split, seed=self.seed)
    return itertools.islice(texts, data.max_docs or None)

  def train_iterator(self) -> BatchIterator:
    return BatchIterator(self._rows[self.train_split], self.make_example,
                         batch_size=self.batch_size, seed=self.seed,
                         process_index=self.process_index,
                         process_count=self.process_count, workers=self.workers,
                         partners=self.partners, make_batch=self.make_batch)

  def eval_iterator(self, num_batches: int | None = None) -> Iterator[Example]:
    """The same eval batches (and masks) every time it is called."""
    it = BatchIterator(self._rows[self.eval_split], self.make_example,
                       batch_size=self.batch_size, seed=self.seed + 1,
                       shuffle=False, repeat=False,
                       process_index=self.process_index,
                       process_count=self.process_count, partners=self.partners,
                       make_batch=self.make_batch)
    for i, batch in enumerate(it):
      if num_batches and i >= num_batches:
        return
      yield batch

  def num_rows(self, split: str) -> int:
    return len(self._rows[split])

  def rows_tokens(self, split: str) -> np.ndarray:
    """The split's rows' tokens, [rows, row length], read whole: for
    inspection and tests of small corpora, never for training."""
    return self._rows[split].tokens_array()

  def num_tokens(self, split: str) -> int:
    """Token slots in the split's rows as the model sees them (framing and
    the padding of packed rows included)."""
    framed = 2 if isinstance(self.make_example, Framed) else 0
    return self.num_rows(split) * (self._rows[split].layout.row_length + framed)
