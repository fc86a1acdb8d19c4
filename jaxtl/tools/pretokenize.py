r"""Tokenizes a recipe's corpus once, into ArrayRecord shards a run reads.

  jaxtl pretokenize --config=pretrain_mixed --out=DIR \
      [--splits=train,validation] [--num_shards=4]

(or ``python -m jaxtl.tools.pretokenize --config=configs/pretrain_mixed.py``:
that spelling takes a config file's path, not a recipe's name), then
  jaxtl pretrain --config=pretrain_mixed --workdir=W \
      --config.data.source.kind=pretokenized --config.data.source.data_dir=DIR

The config's ``data.source`` is read (a weighted mixture drawn with its
``seed``), and its tokenizer loaded from ``data.tokenizer.path`` or trained
as a run would train it, on the train split; it is kept in ``DIR/tokenizer``
and its fingerprint in ``DIR/pretokenized.json``, so a run on the shards
uses it (or refuses another). See jaxtl.data.pretokenized.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Iterator

from jaxtl.data import pipeline, pretokenized, sources

log = logging.getLogger(__name__)


def pretokenize(config: Any, out: str, *, splits: tuple[str, ...] = (),
                num_shards: int = 1) -> dict[str, Any]:
  """Writes ``config.data``'s splits (default: its train and eval splits),
  tokenized, under ``out``; returns the metadata written."""
  data = config.data
  if data.source.kind == "pretokenized":
    raise ValueError("config.data.source.kind is already 'pretokenized'")
  splits = tuple(splits) or (data.train_split, data.eval_split)

  def split_texts(split: str) -> Callable[[], Iterator[str]]:
    """The split's texts, streamed again each time (they are never held)."""
    return lambda: sources.iter_texts(data.source, split, seed=config.seed)

  tokenizer = pipeline.build_tokenizer(data, out, split_texts(data.train_split))
  meta = pretokenized.write(out, tokenizer, {s: split_texts(s) for s in splits},
                            num_shards=num_shards, source=data.source.to_dict(),
                            seed=config.seed)
  for split, info in meta["splits"].items():
    log.info("%s: %d documents, %d tokens in %d shard(s)", split,
             info["documents"], info["tokens"], len(info["shards"]))
  return meta


def main(argv: list[str]) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  start = time.perf_counter()
  pretokenize(f.config, f.out, splits=tuple(f.splits), num_shards=f.num_shards)
  log.info("wrote %s in %.1f s", os.path.abspath(f.out), time.perf_counter() - start)


def _define_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "A pretraining recipe "
                                  "(its data section is read).", lock_config=True)
  flags.DEFINE_string("out", None, "Folder for the shards, their tokenizer and "
                      "pretokenized.json.")
  flags.DEFINE_list("splits", [], "Splits to write (default: the config's "
                    "train_split and eval_split).")
  flags.DEFINE_integer("num_shards", 1, "ArrayRecord files per split.")
  flags.mark_flags_as_required(["config", "out"])


if __name__ == "__main__":
  from jaxtl import console  # pylint: disable=g-import-not-at-top
  _define_flags()
  console.run(main)
