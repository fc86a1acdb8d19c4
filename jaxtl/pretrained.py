"""Any pretrained model by path: a jaxtl workdir or checkpoint, or a Hugging
Face model folder (converted on the fly), as (config, tokenizer, params)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxtl.train import checkpoint
from jaxtl import convert, train
from jaxtl.data import pipeline, sources
from jaxtl.data.tokenizer_files import get_tokenizer
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig, paths


@dataclasses.dataclass
class Pretrained:
  """A loaded model.

  Attributes:
    config: Its architecture.
    tokenizer: The tokenizer it was trained with (or the one asked for).
    params: The backbone's parameters (``build_model(config)``'s tree).
    head: Task-head parameters the checkpoint carries: BERT's ``pooler``
      (a classifier from another task never fits, so it is left out).
  """
  config: TransformerConfig
  tokenizer: Tokenizer
  params: dict[str, Any]
  head: dict[str, Any]


def load(init_from: str, tokenizer_path: str = "") -> Pretrained:
  """Loads ``init_from``; ``tokenizer_path`` overrides the model's own tokenizer."""
  path = sources.expand_path(init_from)
  tok = get_tokenizer(sources.expand_path(tokenizer_path)) if tokenizer_path else None
  if convert.is_hf_folder(path):
    imported = convert.import_hf(path)
    head = {k: v for k, v in imported.head.items() if k == paths.POOLER}
    return Pretrained(imported.config, tok or get_tokenizer(path), imported.params, head)
  return Pretrained(train.load_model_config(path), tok or pipeline.workdir_tokenizer(path),
                    checkpoint.load_params(path), {})
