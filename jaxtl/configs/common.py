"""The config skeleton every recipe starts from, and the ``:key=value`` parser.

Every key a recipe or the command line may set exists here, with its type,
so a misspelt override (``--config.optim.lrr=1``) or a wrong type fails
loudly, naming the key. Recipes change values; they never add keys.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from jaxtl.configs import models
from jaxtl import objectives


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """``"model=gpt2_tiny,steps=10"`` -> ConfigDict, typed by ``defaults``."""
  values = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in defaults:
      raise ValueError(f"config argument {item!r}: expected key=value with a "
                       f"key in {sorted(defaults)}")
    values[key] = type(defaults[key])(value)
  return ml_collections.ConfigDict(values)


def data_dir_path(*parts: str) -> str:
  """A path under $JAXTL_DATA_DIR, or "" when the variable is unset."""
  root = os.environ.get("JAXTL_DATA_DIR", "")
  return os.path.join(root, *parts) if root else ""


def base_config(model: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = models.get_model_config(model)
  c.vocab_multiple = 128  # Pad the embedding to a multiple (shards evenly).

  c.objective = ml_collections.ConfigDict(dict(
      name="clm",
      mask_rate=0.15, mask_token_rate=0.8, random_token_rate=0.1,  # mlm
      noise_density=0.15, mean_noise_span_length=3.0,  # span
      # Positions whose logits exist at once in the loss (0: all of them).
      loss_chunk_len=objectives.LOSS_CHUNK_LEN))

  c.data = ml_collections.ConfigDict()
  # kind: tfds | text | jsonl | tsv | mixture; file kinds map split -> list
  # of paths; a mixture maps part names to such sources.
  c.data.source = ml_collections.ConfigDict(dict(
      kind="tfds", name="", data_dir="", manual_dir="", field="text",
      files=ml_collections.ConfigDict(), paragraphs=False, encoding="utf-8",
      parts=ml_collections.ConfigDict()))
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.data.tokenizer = ml_collections.ConfigDict(dict(
      path="",  # a .model file; empty: train one on the train split.
      vocab_size=8000, model_type="unigram", max_sentences=500_000))
  c.data.seq_len = 128  # input length (encoder inputs for span corruption).
  c.data.packing = "chunk"  # chunk | pack
  c.data.batch_size = 32  # global, over all processes.
  c.data.max_docs = 0  # 0: all documents of a split.
  c.data.cache = True  # cache tokenized rows in the workdir.
  c.data.prefetch = 2

  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-3, warmup_steps=100, schedule="cosine", end_lr_ratio=0.1,
      weight_decay=0.01, b1=0.9, b2=0.98, eps=1e-8, clip_norm=1.0,
      accum_steps=1))

  c.train = ml_collections.ConfigDict(dict(
      steps=1000, log_every=50, eval_every=250, eval_batches=20,
      checkpoint_every=250, keep_checkpoints=3, max_bad_steps=20,
      peak_flops=0.0))  # 0: look the device up in jaxtl.train.perf.PEAK_FLOPS.

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the rest.
  c.mesh.rules = ml_collections.ConfigDict()  # logical axis -> mesh axes.
  return c
