"""DistilBERT (``DistilBertModel``, ``DistilBertForMaskedLM``, the token
classifier and the QA head).

BERT's post-LN blocks without token types or a pooler, under its own names
(``q_lin``, ``sa_layer_norm``, ``ffn.lin1`` ...), LayerNorm epsilon 1e-12
throughout; the MLM head (``vocab_transform``, ``vocab_layer_norm``,
``vocab_projector`` tied to the word embeddings) is BERT's. An encoder
without token types exports as DistilBERT (BERT always adds them).
``DistilBertForSequenceClassification`` pools with dense + ReLU
(``pre_classifier``), which no jaxtl pooling computes: it is refused.
"""

from __future__ import annotations

from typing import Any

from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, activation_from_hf, get
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig

NORM_EPS = 1e-12  # fixed in DistilBERT's code, not in its config


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  d, h = get(hf, "dim"), get(hf, "n_heads")
  if d % h:
    raise ValueError(f"dim={d} is not a multiple of n_heads={h}")
  return TransformerConfig(
      family="encoder", vocab_size=get(hf, "vocab_size"), d_model=d, num_heads=h,
      head_dim=d // h, mlp_dim=get(hf, "hidden_dim"), num_layers=get(hf, "n_layers"),
      max_len=get(hf, "max_position_embeddings"), type_vocab_size=0,
      activation=activation_from_hf(hf.get("activation", "gelu")),
      norm="layernorm", norm_eps=NORM_EPS, pre_norm=False, embed_norm=True,
      use_bias=True, scale_attention=True, dropout_rate=hf.get("dropout", 0.1),
      attention_dropout_rate=hf.get("attention_dropout", 0.1), tie_embeddings=True,
      lm_head_transform=True, lm_head_bias=True,
      init_std=hf.get("initializer_range", 0.02))


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  return {
      "model_type": "distilbert", "vocab_size": cfg.vocab_size, "dim": cfg.d_model,
      "n_heads": cfg.num_heads, "hidden_dim": cfg.mlp_dim, "n_layers": cfg.num_layers,
      "max_position_embeddings": cfg.max_len, "activation": cfg.activation,
      "dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
      "initializer_range": cfg.init_std, "sinusoidal_pos_embds": False,
      "tie_weights_": True, "pad_token_id": 0,
  }


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  embedder = P.join(P.STACK, P.EMBEDDER)
  out = [
      R.Rule("embeddings.word_embeddings.weight", P.TOKEN_TABLE, "copy"),
      R.Rule("embeddings.position_embeddings.weight",
             P.join(embedder, P.POSITION_EMBEDDING), "copy"),
      *R.norm_rules("embeddings.LayerNorm", P.join(embedder, P.EMBED_NORM), bias=True),
  ]
  qkvo = {P.QUERY: "q_lin", P.KEY: "k_lin", P.VALUE: "v_lin", P.OUT: "out_lin"}
  for i in range(cfg.num_layers):
    hf, ours = f"transformer.layer.{i}", P.join(P.STACK, P.layer(i))
    out += R.attention_rules(f"{hf}.attention", P.join(ours, P.SELF_ATTENTION), qkvo,
                             bias=True)
    out += R.norm_rules(f"{hf}.sa_layer_norm", P.join(ours, P.norm(P.SELF_ATTENTION)),
                        bias=True)
    out += R.dense_rules(f"{hf}.ffn.lin1", P.join(ours, P.MLP, P.WI), bias=True)
    out += R.dense_rules(f"{hf}.ffn.lin2", P.join(ours, P.MLP, P.WO), bias=True)
    out += R.norm_rules(f"{hf}.output_layer_norm", P.join(ours, P.norm(P.MLP)),
                        bias=True)
  out += R.dense_rules("vocab_transform", P.join(P.LM_HEAD, P.TRANSFORM), bias=True,
                       group="mlm")
  out += R.norm_rules("vocab_layer_norm", P.join(P.LM_HEAD, P.TRANSFORM_NORM),
                      bias=True, group="mlm")
  out.append(R.Rule("vocab_projector.bias", P.join(P.LM_HEAD, P.BIAS), "vector", "mlm"))
  out += R.dense_rules("classifier", P.join(P.HEAD, P.HEAD_OUT), bias=True,
                       group="classifier")
  out += R.dense_rules("qa_outputs", P.join(P.HEAD, P.HEAD_OUT), bias=True, group="qa")
  return out


FAMILY = Family(
    model_type="distilbert", family="encoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="distilbert.",
    base_architecture="DistilBertModel", base_groups=("base",),
    architectures={"DistilBertModel": ("base",),
                   "DistilBertForMaskedLM": ("base", "mlm"),
                   "DistilBertForTokenClassification": ("base", "classifier"),
                   "DistilBertForQuestionAnswering": ("base", "qa")},
    tied={"vocab_projector.weight": "embeddings.word_embeddings.weight"},
    ignored=(r"^embeddings\.position_ids$",),
    tasks={"token_classification": "DistilBertForTokenClassification",
           "span_qa": "DistilBertForQuestionAnswering"},
)
