"""BERT (``BertModel``, ``BertForMaskedLM``, ``BertForSequenceClassification``).

Post-LN blocks, exact GELU, token-type embeddings and an embedding
LayerNorm; the MLM head is dense + GELU + LayerNorm, then the tied word
embeddings plus an output bias. The pooler (dense + tanh on ``[CLS]``) and
the classifier become the task head's ``pooler`` and ``out``.
"""

from __future__ import annotations

from typing import Any

from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, activation_from_hf, get
from jaxtl.models.config import TransformerConfig


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
  if d % h:
    raise ValueError(f"hidden_size={d} is not a multiple of num_attention_heads={h}")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError("only absolute position embeddings are supported, not "
                     f"{hf['position_embedding_type']!r}")
  return TransformerConfig(
      family="encoder", vocab_size=get(hf, "vocab_size"), d_model=d, num_heads=h,
      head_dim=d // h, mlp_dim=get(hf, "intermediate_size"),
      num_layers=get(hf, "num_hidden_layers"),
      max_len=get(hf, "max_position_embeddings"),
      type_vocab_size=hf.get("type_vocab_size", 2),
      activation=activation_from_hf(hf.get("hidden_act", "gelu")),
      norm="layernorm", norm_eps=hf.get("layer_norm_eps", 1e-12), pre_norm=False,
      embed_norm=True, use_bias=True, scale_attention=True,
      dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      tie_embeddings=True, lm_head_transform=True, lm_head_bias=True,
      init_std=hf.get("initializer_range", 0.02))


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  return {
      "model_type": "bert", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
      "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
      "hidden_act": cfg.activation, "layer_norm_eps": cfg.norm_eps,
      "hidden_dropout_prob": cfg.dropout_rate,
      "attention_probs_dropout_prob": cfg.attention_dropout_rate,
      "initializer_range": cfg.init_std, "position_embedding_type": "absolute",
      "pad_token_id": 0,
  }


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  out = [
      R.Rule("embeddings.word_embeddings.weight", "token_embed/embedding", "copy"),
      R.Rule("embeddings.position_embeddings.weight",
             "stack/embedder/position_embedding", "copy"),
      R.Rule("embeddings.token_type_embeddings.weight",
             "stack/embedder/token_type_embedding", "copy"),
      *R.norm_rules("embeddings.LayerNorm", "stack/embedder/norm", bias=True),
  ]
  for i in range(cfg.num_layers):
    hf, ours = f"encoder.layer.{i}", f"stack/layer_{i}"
    out += R.attention_rules(f"{hf}.attention", f"{ours}/self_attention",
                             {"query": "self.query", "key": "self.key",
                              "value": "self.value", "out": "output.dense"}, bias=True)
    out += R.norm_rules(f"{hf}.attention.output.LayerNorm", f"{ours}/self_attention_norm",
                        bias=True)
    out += R.dense_rules(f"{hf}.intermediate.dense", f"{ours}/mlp/wi", bias=True)
    out += R.dense_rules(f"{hf}.output.dense", f"{ours}/mlp/wo", bias=True)
    out += R.norm_rules(f"{hf}.output.LayerNorm", f"{ours}/mlp_norm", bias=True)
  out += R.dense_rules("pooler.dense", "head/pooler", bias=True, group="pooler")
  out += R.dense_rules("cls.predictions.transform.dense", "lm_head/transform",
                       bias=True, group="mlm")
  out += R.norm_rules("cls.predictions.transform.LayerNorm", "lm_head/transform_norm",
                      bias=True, group="mlm")
  out.append(R.Rule("cls.predictions.bias", "lm_head/bias", "vector", "mlm"))
  out += R.dense_rules("classifier", "head/out", bias=True, group="classifier")
  return out


FAMILY = Family(
    model_type="bert", family="encoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="bert.",
    base_architecture="BertModel", base_groups=("base", "pooler"),
    architectures={"BertModel": ("base", "pooler"),
                   "BertForMaskedLM": ("base", "mlm"),
                   "BertForSequenceClassification": ("base", "pooler", "classifier")},
    # Tied copies: the MLM decoder is the word embedding table plus the bias.
    tied={"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    ignored=(r"^embeddings\.position_ids$", r"^cls\.seq_relationship\."),
)
