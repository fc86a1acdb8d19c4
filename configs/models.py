"""Model presets: BERT, GPT-2, T5 and BART sizes as TransformerConfig fields.

Recipes pick one by name (``model=bert_tiny``) and override single fields
from the command line (``--config.model.num_layers=2``). ``vocab_size=0``
means "take it from the tokenizer".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from jaxtl.runtime import console

_BERT = dict(family="encoder", position="learned", type_vocab_size=2,
             activation="gelu", norm="layernorm", norm_eps=1e-12,
             pre_norm=False, embed_norm=True, use_bias=True,
             dropout_rate=0.1, attention_dropout_rate=0.1, tie_embeddings=True,
             lm_head_transform=True, lm_head_bias=True, max_len=512)
_GPT2 = dict(family="decoder", position="learned", type_vocab_size=0,
             activation="gelu_new", norm="layernorm", norm_eps=1e-5,
             pre_norm=True, embed_norm=False, use_bias=True, dropout_rate=0.1,
             attention_dropout_rate=0.1, tie_embeddings=True, max_len=1024)
_T5 = dict(family="encoder_decoder", position="relative", relative_buckets=32,
           relative_max_distance=128, activation="relu", norm="rmsnorm",
           norm_eps=1e-6, pre_norm=True, embed_norm=False, use_bias=False,
           scale_attention=False, dropout_rate=0.1, attention_dropout_rate=0.0,
           tie_embeddings=True, scale_tied_logits=True, max_len=512)
# BART: T5's shape with BERT's layers (learned positions per stack, post-LN,
# an embedding LayerNorm, exact GELU, biases) and one table shared by both
# stacks and the head, whose output bias is HF's ``final_logits_bias``.
_BART = dict(family="encoder_decoder", position="learned", activation="gelu",
             norm="layernorm", norm_eps=1e-5, pre_norm=False, embed_norm=True,
             use_bias=True, dropout_rate=0.1, attention_dropout_rate=0.0,
             tie_embeddings=True, lm_head_bias=True, max_len=1024)


def _size(layers: int, d_model: int, heads: int, mlp: int, **kw) -> dict:
  return dict(num_layers=layers, d_model=d_model, num_heads=heads,
              head_dim=kw.pop("head_dim", d_model // heads), mlp_dim=mlp, **kw)


PRESETS: dict[str, dict] = {
    # Google's compact BERTs (Turc et al. 2019) and BERT-base.
    "bert_tiny": {**_BERT, **_size(2, 128, 2, 512)},
    "bert_mini": {**_BERT, **_size(4, 256, 4, 1024)},
    "bert_small": {**_BERT, **_size(4, 512, 8, 2048)},
    "bert_base": {**_BERT, **_size(12, 768, 12, 3072)},
    # all-MiniLM-L6-v2's shape (the BERT-on-TREC model of the README).
    "minilm_l6": {**_BERT, **_size(6, 384, 12, 1536)},
    "gpt2_tiny": {**_GPT2, **_size(4, 256, 4, 1024, max_len=512)},
    "gpt2_small": {**_GPT2, **_size(12, 768, 12, 3072)},
    # t5_tiny is a v1.1-style (gated GELU) miniature; t5_small is T5 v1.0 small.
    "t5_tiny": {**_T5, **_size(2, 256, 4, 512, head_dim=64),
                "activation": "gelu_new", "gated_mlp": True,
                "num_decoder_layers": 2},
    "t5_small": {**_T5, **_size(6, 512, 8, 2048, head_dim=64)},
    # bart_tiny matches t5_tiny's stacks; bart_base is facebook/bart-base.
    "bart_tiny": {**_BART, **_size(2, 256, 4, 1024, max_len=512)},
    "bart_base": {**_BART, **_size(6, 768, 12, 3072)},
}


def fields() -> dict[str, tuple[Any, str]]:
  """Every TransformerConfig field: its default as a config holds it, and
  its meaning (the field's metadata, the one place it is written).

  ``vocab_size`` 0 takes it from the tokenizer; ``attention_impl`` None
  becomes "", since None is not a type ml_collections can check overrides
  against; ``dtype`` is ``auto`` (``jaxtl.pretraining.pretrain.precision``).
  """
  from jaxtl.models.config import TransformerConfig  # pylint: disable=g-import-not-at-top
  config_value = {"vocab_size": 0, "attention_impl": "", "dtype": "auto"}
  return {f.name: (config_value.get(f.name, f.default), f.metadata["meaning"])
          for f in dataclasses.fields(TransformerConfig)}


def get_model_config(name: str) -> ml_collections.ConfigDict:
  """A preset as a ConfigDict with every TransformerConfig field present."""
  if name not in PRESETS:
    raise ValueError(console.unknown("model preset", name, sorted(PRESETS)))
  values = {key: default for key, (default, _) in fields().items()}
  values.update(PRESETS[name])
  return ml_collections.ConfigDict(values)
