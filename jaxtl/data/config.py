"""The pretraining input's typed sections (config.data): the corpus, the
tokenizer, and how its documents become rows and batches
(:mod:`jaxtl.pretraining.pipeline` reads them)."""

from __future__ import annotations

import dataclasses

from jaxtl.data.sources import SourceConfig, TfdsSource
from jaxtl.sections import key, section


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
  """A sentencepiece model to load, or to train on the train split."""
  path: str = key("", "a sentencepiece .model file; \"\": train one on the train split")
  vocab_size: int = key(8000, "vocabulary size of a trained tokenizer")
  model_type: str = key("unigram", "algorithm of a trained tokenizer: unigram | bpe")
  max_sentences: int = key(500_000, "most sentences a tokenizer trains on (a seeded "
                                    "sample)")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The host pipeline: corpus, tokenizer, rows and batches."""
  source: SourceConfig = section(TfdsSource, "a corpus, read as a stream by "
                                             "jaxtl.data.sources.iter_texts")
  train_split: str = key("train", "the source's split to train on")
  eval_split: str = key("validation", "the source's split to evaluate on")
  tokenizer: TokenizerConfig = section(TokenizerConfig)
  seq_len: int = key(128, "tokens per row (span corruption: the encoder's inputs)")
  packing: str = key("chunk", "chunk (documents joined and cut) | pack (documents "
                              "kept apart in rows)")
  batch_size: int = key(32, "rows per batch, over all processes")
  max_docs: int = key(0, "documents read per split; 0: all")
  cache: bool = key(True, "keep the rows in WORKDIR/data_cache (else a temporary folder)")
  workers: int = key(0, "Grain processes that read rows and apply the objective; 0: "
                        "the training process's prefetch thread")
  prefetch: int = key(2, "batches prepared ahead of the training step")
