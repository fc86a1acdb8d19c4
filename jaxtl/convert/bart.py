"""BART (``BartForConditionalGeneration``, ``BartModel``).

BERT's layers (post-LN, biases, exact GELU, an embedding LayerNorm) in T5's
shape (an encoder, a decoder with cross-attention, one token table for both
and the head). Two details need the table: each stack's learned position
table starts at row 2 (fairseq reserved two rows: ``offset``), and the head
adds ``final_logits_bias``, a [1, vocab] buffer, which is jaxtl's LM-head
bias. Encoder and decoder must share head counts and MLP widths (one
TransformerConfig describes both); ``scale_embedding`` (mBART-style
sqrt(d_model) token scaling) is not supported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxtl.convert import rules as R
from jaxtl.convert.family import (JAXTL_IDS, Family, SpecialIds, activation_from_hf,
                                  decoder_start_from_hf, get, special_ids_to_hf)
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig

# fairseq's learned positions start at 2; HF keeps its two unused rows.
POSITION_OFFSET = 2


def _same(hf: dict[str, Any], key: str) -> int:
  """``encoder_{key}``, checked equal to ``decoder_{key}``."""
  enc, dec = get(hf, f"encoder_{key}"), get(hf, f"decoder_{key}")
  if enc != dec:
    raise ValueError(f"config.json has encoder_{key}={enc} but decoder_{key}={dec}; "
                     "jaxtl's encoder-decoder uses one value for both")
  return enc


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  d, heads = get(hf, "d_model"), _same(hf, "attention_heads")
  if d % heads:
    raise ValueError(f"d_model={d} is not a multiple of the attention heads ({heads})")
  if hf.get("scale_embedding", False):
    raise ValueError("config.json has scale_embedding=true (token embeddings times "
                     "sqrt(d_model)), which jaxtl's BART does not support")
  return TransformerConfig(
      family="encoder_decoder", vocab_size=get(hf, "vocab_size"), d_model=d,
      num_heads=heads, head_dim=d // heads, mlp_dim=_same(hf, "ffn_dim"),
      num_layers=get(hf, "encoder_layers"), num_decoder_layers=get(hf, "decoder_layers"),
      max_len=get(hf, "max_position_embeddings"), position="learned",
      activation=activation_from_hf(hf.get("activation_function", "gelu")),
      norm="layernorm", norm_eps=1e-5, pre_norm=False, embed_norm=True, use_bias=True,
      scale_attention=True, dropout_rate=hf.get("dropout", 0.1),
      attention_dropout_rate=hf.get("attention_dropout", 0.0),
      tie_embeddings=hf.get("tie_word_embeddings", True), lm_head_bias=True,
      decoder_start=decoder_start_from_hf(hf), init_std=hf.get("init_std", 0.02))


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  both = lambda key, value: {f"encoder_{key}": value, f"decoder_{key}": value}
  return {
      "model_type": "bart", "vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
      **both("attention_heads", cfg.num_heads), **both("ffn_dim", cfg.mlp_dim),
      "encoder_layers": cfg.num_layers, "decoder_layers": cfg.decoder_layers,
      "max_position_embeddings": cfg.max_len, "activation_function": cfg.activation,
      "dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
      "activation_dropout": 0.0, "init_std": cfg.init_std, "scale_embedding": False,
      "tie_word_embeddings": cfg.tie_embeddings, "is_encoder_decoder": True,
      **special_ids(cfg, JAXTL_IDS),
  }


def special_ids(cfg: TransformerConfig, ids: SpecialIds) -> dict[str, Any]:
  """T5's fields, plus BART's BOS (``<s>``, 0 in its own tokenizer) and the
  EOS its ``generate`` forces at the length limit (``forced_eos_token_id``)."""
  out = {**special_ids_to_hf(cfg, ids), "forced_eos_token_id": ids.eos}
  if ids.bos is not None:
    out["bos_token_id"] = ids.bos
  return out


def _layer_rules(hf: str, ours: str, cross: bool) -> list[R.Rule]:
  qkvo = {P.QUERY: "q_proj", P.KEY: "k_proj", P.VALUE: "v_proj", P.OUT: "out_proj"}
  sublayers = [("self_attn", P.SELF_ATTENTION)]
  if cross:
    sublayers.append(("encoder_attn", P.CROSS_ATTENTION))
  out = []
  for theirs, mine in sublayers:
    out += R.attention_rules(f"{hf}.{theirs}", P.join(ours, mine), qkvo, bias=True)
    out += R.norm_rules(f"{hf}.{theirs}_layer_norm", P.join(ours, P.norm(mine)), bias=True)
  out += R.dense_rules(f"{hf}.fc1", P.join(ours, P.MLP, P.WI), bias=True)
  out += R.dense_rules(f"{hf}.fc2", P.join(ours, P.MLP, P.WO), bias=True)
  out += R.norm_rules(f"{hf}.final_layer_norm", P.join(ours, P.norm(P.MLP)), bias=True)
  return out


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  out = [R.Rule("shared.weight", P.TOKEN_TABLE, "copy")]
  for hf, stack, n in (("encoder", P.ENCODER, cfg.num_layers),
                       ("decoder", P.DECODER, cfg.decoder_layers)):
    group = "base" if stack == P.ENCODER else "decoder"
    embedder = P.join(stack, P.EMBEDDER)
    stack_rules = [R.Rule(f"{hf}.embed_positions.weight",
                          P.join(embedder, P.POSITION_EMBEDDING), "copy",
                          skip_rows=POSITION_OFFSET),
                   *R.norm_rules(f"{hf}.layernorm_embedding",
                                 P.join(embedder, P.EMBED_NORM), bias=True)]
    for i in range(n):
      stack_rules += _layer_rules(f"{hf}.layers.{i}", P.join(stack, P.layer(i)),
                                  cross=stack == P.DECODER)
    out += [dataclasses.replace(r, group=group) for r in stack_rules]
  out.append(R.Rule("final_logits_bias", P.join(P.LM_HEAD, P.BIAS), "row", "lm"))
  if not cfg.tie_embeddings:
    out += R.dense_rules("lm_head", P.join(P.LM_HEAD, P.LOGITS), bias=False, group="lm")
  return out


FAMILY = Family(
    model_type="bart", family="encoder_decoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="model.",
    base_architecture="BartModel", base_groups=("base", "decoder"),
    architectures={"BartForConditionalGeneration": ("base", "decoder", "lm"),
                   "BartModel": ("base", "decoder")},
    tasks={"text_to_text": "BartForConditionalGeneration",
           "generation": "BartForConditionalGeneration"},
    special_ids=special_ids,
    # Its other task heads read the encoder, which transformers keeps as a
    # class of its own (with the shared table as its embed_tokens).
    head_backbone="transformers.models.bart.modeling_bart.BartEncoder",
    head_backbone_names=(("shared.", "embed_tokens."), ("encoder.", "")),
    # The stacks' views of the shared table, and a tied head.
    tied={"encoder.embed_tokens.weight": "shared.weight",
          "decoder.embed_tokens.weight": "shared.weight",
          "lm_head.weight": "shared.weight"},
)
