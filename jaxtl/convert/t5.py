"""T5 (``T5ForConditionalGeneration``): v1.0 (ReLU, tied head) and v1.1 (gated GELU).

RMSNorm without bias, no biases anywhere, unscaled attention (T5 folds the
1/sqrt(d) into its initialisation), one relative-position bias table per
stack (held by the first block), and a shared token table. A tied head
multiplies the decoder output by d_model**-0.5 first; v1.1 does not scale,
and has its own ``lm_head`` (checkpoints from transformers < 5) or reuses
the table (transformers >= 5 ties it always; ``scale_decoder_outputs``
then tells v1.0 from v1.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxtl.convert import rules as R
from jaxtl.convert.family import (Family, activation_from_hf, decoder_start_from_hf, get,
                                  special_ids_to_hf)
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig


def _feed_forward(proj: str) -> tuple[str, bool]:
  """``feed_forward_proj`` ("relu", "gated-gelu", ...) -> (activation, gated)."""
  gated = proj.startswith("gated-")
  act = proj.split("-", 1)[1] if gated else proj
  # HF maps T5's "gated-gelu" to the tanh GELU.
  return activation_from_hf("gelu_new" if act == "gelu" and gated else act), gated


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  act, gated = _feed_forward(hf.get("feed_forward_proj", "relu"))
  tied = hf.get("tie_word_embeddings", True)
  # transformers >= 5 always ties and says whether to scale in its own key.
  scale = tied and hf.get("scale_decoder_outputs", True)
  return TransformerConfig(
      family="encoder_decoder", vocab_size=get(hf, "vocab_size"),
      d_model=get(hf, "d_model"), num_heads=get(hf, "num_heads"),
      head_dim=get(hf, "d_kv"), mlp_dim=get(hf, "d_ff"),
      num_layers=get(hf, "num_layers"),
      num_decoder_layers=hf.get("num_decoder_layers") or get(hf, "num_layers"),
      max_len=hf.get("n_positions", 512), position="relative",
      relative_buckets=hf.get("relative_attention_num_buckets", 32),
      relative_max_distance=hf.get("relative_attention_max_distance", 128),
      activation=act, gated_mlp=gated, norm="rmsnorm",
      norm_eps=hf.get("layer_norm_epsilon", 1e-6), pre_norm=True, use_bias=False,
      scale_attention=False, dropout_rate=hf.get("dropout_rate", 0.1),
      attention_dropout_rate=hf.get("dropout_rate", 0.1), tie_embeddings=tied,
      scale_tied_logits=scale, decoder_start=decoder_start_from_hf(hf))


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  act = "gelu" if cfg.activation == "gelu_new" and cfg.gated_mlp else cfg.activation
  return {
      "model_type": "t5", "vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
      "num_heads": cfg.num_heads, "d_kv": cfg.head_dim, "d_ff": cfg.mlp_dim,
      "num_layers": cfg.num_layers, "num_decoder_layers": cfg.decoder_layers,
      "relative_attention_num_buckets": cfg.relative_buckets,
      "relative_attention_max_distance": cfg.relative_max_distance,
      "feed_forward_proj": f"gated-{act}" if cfg.gated_mlp else act,
      "layer_norm_epsilon": cfg.norm_eps, "dropout_rate": cfg.dropout_rate,
      "tie_word_embeddings": cfg.tie_embeddings,
      "scale_decoder_outputs": cfg.tie_embeddings and cfg.scale_tied_logits,
      "is_encoder_decoder": True, **special_ids_to_hf(cfg),
  }


def _block_rules(cfg: TransformerConfig, hf_stack: str, stack: str, i: int
                 ) -> list[R.Rule]:
  hf, ours = f"{hf_stack}.block.{i}.layer", P.join(stack, P.layer(i))
  qkvo = {P.QUERY: "q", P.KEY: "k", P.VALUE: "v", P.OUT: "o"}
  sublayers = [("SelfAttention", P.SELF_ATTENTION)]
  if stack == P.DECODER:
    sublayers.append(("EncDecAttention", P.CROSS_ATTENTION))
  out = []
  for j, (theirs, mine) in enumerate(sublayers):
    out += R.attention_rules(f"{hf}.{j}.{theirs}", P.join(ours, mine), qkvo, bias=False)
    out += R.norm_rules(f"{hf}.{j}.layer_norm", P.join(ours, P.norm(mine)), bias=False)
  ff = f"{hf}.{len(sublayers)}"
  mlp = ((("wi_0", P.WI_0), ("wi_1", P.WI_1)) if cfg.gated_mlp else (("wi", P.WI),))
  for theirs, mine in mlp + (("wo", P.WO),):
    out += R.dense_rules(f"{ff}.DenseReluDense.{theirs}", P.join(ours, P.MLP, mine),
                         bias=False)
  out += R.norm_rules(f"{ff}.layer_norm", P.join(ours, P.norm(P.MLP)), bias=False)
  return out


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  out = [R.Rule("shared.weight", P.TOKEN_TABLE, "copy")]
  for hf, stack, n in (("encoder", P.ENCODER, cfg.num_layers),
                       ("decoder", P.DECODER, cfg.decoder_layers)):
    out.append(R.Rule(f"{hf}.block.0.layer.0.SelfAttention.relative_attention_bias"
                      ".weight", P.join(stack, P.RELATIVE_BIAS, P.REL_EMBEDDING), "copy"))
    for i in range(n):
      out += _block_rules(cfg, hf, stack, i)
    out += R.norm_rules(f"{hf}.final_layer_norm", P.join(stack, P.FINAL_NORM), bias=False)
  if not cfg.tie_embeddings:
    out += R.dense_rules("lm_head", P.join(P.LM_HEAD, P.LOGITS), bias=False)
  # The decoder is a group of its own: a model fine-tuned on the encoder alone
  # (token classification) has none, and is a T5ForTokenClassification.
  out = [dataclasses.replace(r, group="decoder") if r.hf.startswith(("decoder.", "lm_head"))
         else r for r in out]
  out += R.dense_rules("classifier", P.join(P.HEAD, P.HEAD_OUT), bias=True,
                       group="classifier")
  return out


FAMILY = Family(
    model_type="t5", family="encoder_decoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="", base_architecture="T5Model",
    base_groups=("base", "decoder"),
    architectures={"T5ForConditionalGeneration": ("base", "decoder"),
                   "T5ForTokenClassification": ("base", "classifier")},
    # T5ForTokenClassification keeps its encoder (a T5EncoderModel) under
    # ``transformer.``; T5ForConditionalGeneration has no prefix.
    prefixes={"T5ForTokenClassification": "transformer."},
    # Fine-tuned as text_to_text or generation, T5 is still its LM; a
    # tagger is the encoder with a linear classifier per token, as jaxtl's.
    tasks={"text_to_text": "T5ForConditionalGeneration",
           "generation": "T5ForConditionalGeneration",
           "token_classification": "T5ForTokenClassification"},
    special_ids=special_ids_to_hf,
    # Its other task heads (a classifier over pooled states, span QA) read the
    # encoder, whose names in T5EncoderModel are the base group's.
    head_backbone="T5EncoderModel",
    # The stacks' own views of the shared table; a tied head is the table too
    # (an untied one has its own rule, which takes precedence).
    tied={"encoder.embed_tokens.weight": "shared.weight",
          "decoder.embed_tokens.weight": "shared.weight",
          "lm_head.weight": "shared.weight"},
)
