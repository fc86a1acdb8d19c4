r"""``jaxtl pretokenize``: tokenizes a recipe's corpus once, into ArrayRecord shards a run reads.

  jaxtl pretokenize --config=pretrain_mixed --out=DIR \
      [--splits=train,validation] [--num_shards=4]

then
  jaxtl pretrain --config=pretrain_mixed --workdir=W \
      --config.data.source.kind=pretokenized --config.data.source.data_dir=DIR

The config's ``data.source`` is read (a weighted mixture drawn with its
``seed``), and its tokenizer loaded from ``data.tokenizer.path`` or trained
as a run would train it, on the train split; it is kept in ``DIR/tokenizer``
and its fingerprint in ``DIR/pretokenized.json``, so a run on the shards
uses it (or refuses another).
"""

from __future__ import annotations

import logging
import os
import time

from absl import flags
from ml_collections import config_flags

from jaxtl.pretraining import config as pretrain_config
from jaxtl.pretraining.pretokenize import pretokenize

config_flags.DEFINE_config_file("config", None, "A pretraining recipe "
                                "(its data section is read).", lock_config=True)
flags.DEFINE_string("out", None, "Folder for the shards, their tokenizer and "
                    "pretokenized.json.")
flags.DEFINE_list("splits", [], "Splits to write (default: the config's "
                  "train_split and eval_split).")
flags.DEFINE_integer("num_shards", 1, "ArrayRecord files per split.")
flags.mark_flags_as_required(["config", "out"])
FLAGS = flags.FLAGS
log = logging.getLogger(__name__)


def main(argv: list[str]) -> None:
  del argv
  start = time.perf_counter()
  pretokenize(pretrain_config.of(FLAGS.config), FLAGS.out, splits=tuple(FLAGS.splits),
              num_shards=FLAGS.num_shards)
  log.info("wrote %s in %.1f s", os.path.abspath(FLAGS.out), time.perf_counter() - start)
