"""A recipe's corpus tokenized once into ArrayRecord shards (``jaxtl
pretokenize``), with the tokenizer a run on them must use: a run reads the
shards (``data.source.kind=pretokenized``) instead of tokenizing its corpus
again. The shards' format is :mod:`jaxtl.data.pretokenized`'s."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterator

from jaxtl.data import pretokenized, sources
from jaxtl.pretraining import pipeline
from jaxtl.pretraining.config import PretrainConfig

log = logging.getLogger(__name__)


def pretokenize(config: PretrainConfig, out: str, *, splits: tuple[str, ...] = (),
                num_shards: int = 1) -> dict[str, Any]:
  """Writes ``config.data``'s splits (default: its train and eval splits),
  tokenized, under ``out``; returns the metadata written."""
  data = config.data
  if isinstance(data.source, sources.PretokenizedSource):
    raise ValueError("config.data.source.kind is already 'pretokenized'")
  splits = tuple(splits) or (data.train_split, data.eval_split)

  def split_texts(split: str) -> Callable[[], Iterator[str]]:
    """The split's texts, streamed again each time (they are never held)."""
    return lambda: sources.iter_texts(data.source, split, seed=config.seed)

  tokenizer = pipeline.build_tokenizer(data, out, split_texts(data.train_split))
  meta = pretokenized.write(out, tokenizer, {s: split_texts(s) for s in splits},
                            num_shards=num_shards, source=dataclasses.asdict(data.source),
                            seed=config.seed)
  for split, info in meta["splits"].items():
    log.info("%s: %d documents, %d tokens in %d shard(s)", split,
             info["documents"], info["tokens"], len(info["shards"]))
  return meta
