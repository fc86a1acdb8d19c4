"""BERT (``BertModel``, ``BertForMaskedLM``, ``BertForPreTraining`` and the
task classes).

Post-LN blocks, exact GELU, token-type embeddings and an embedding
LayerNorm; the MLM head is dense + GELU + LayerNorm, then the tied word
embeddings plus an output bias. The pooler (dense + tanh on ``[CLS]``) and
the classifier become the task head's ``pooler`` and ``out``; the token
classifier and ``qa_outputs`` (start, end) are ``out`` too, with no pooler.
``BertForPreTraining``'s next-sentence head (the pooler and
``cls.seq_relationship``) becomes the backbone's ``sentence_head``
(``sentence_classes=2``), which NSP pretraining goes on training; its
pooler also fills the task head's, for fine-tuning with ``pooling="pooler"``.
"""

from __future__ import annotations

from typing import Any

from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, activation_from_hf, get
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig


# Classes with the next-sentence head (they get config.sentence_classes=2).
NSP_ARCHITECTURES = ("BertForPreTraining", "BertForNextSentencePrediction")


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
      init_std=hf.get("initializer_range", 0.02),
      sentence_classes=2 if set(hf.get("architectures") or ()) & set(NSP_ARCHITECTURES)
      else 0)


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  return {
      "model_type": "bert", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
      "max_position_embeddings": cfg.max_len,
      # BERT always adds a token-type row: a model without types is not one
      # (DistilBERT is), which the round trip of the export check then says.
      "type_vocab_size": max(cfg.type_vocab_size, 1),
      "hidden_act": cfg.activation, "layer_norm_eps": cfg.norm_eps,
      "hidden_dropout_prob": cfg.dropout_rate,
      "attention_probs_dropout_prob": cfg.attention_dropout_rate,
      "initializer_range": cfg.init_std, "position_embedding_type": "absolute",
      "pad_token_id": 0,
  }


def encoder_rules(cfg: TransformerConfig, position_rows: int = 0) -> list[R.Rule]:
  """The base model's tensors: embeddings and layers (BERT's and RoBERTa's,
  whose position table has ``position_rows`` rows before the first position)."""
  embedder = P.join(P.STACK, P.EMBEDDER)
  out = [
      R.Rule("embeddings.word_embeddings.weight", P.TOKEN_TABLE, "copy"),
      R.Rule("embeddings.position_embeddings.weight",
             P.join(embedder, P.POSITION_EMBEDDING), "copy", skip_rows=position_rows),
      R.Rule("embeddings.token_type_embeddings.weight",
             P.join(embedder, P.TOKEN_TYPE_EMBEDDING), "copy"),
      *R.norm_rules("embeddings.LayerNorm", P.join(embedder, P.EMBED_NORM), bias=True),
  ]
  qkvo = {P.QUERY: "self.query", P.KEY: "self.key", P.VALUE: "self.value",
          P.OUT: "output.dense"}
  for i in range(cfg.num_layers):
    hf, ours = f"encoder.layer.{i}", P.join(P.STACK, P.layer(i))
    out += R.attention_rules(f"{hf}.attention", P.join(ours, P.SELF_ATTENTION), qkvo,
                             bias=True)
    out += R.norm_rules(f"{hf}.attention.output.LayerNorm",
                        P.join(ours, P.norm(P.SELF_ATTENTION)), bias=True)
    out += R.dense_rules(f"{hf}.intermediate.dense", P.join(ours, P.MLP, P.WI), bias=True)
    out += R.dense_rules(f"{hf}.output.dense", P.join(ours, P.MLP, P.WO), bias=True)
    out += R.norm_rules(f"{hf}.output.LayerNorm", P.join(ours, P.norm(P.MLP)), bias=True)
  return out


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  out = encoder_rules(cfg)
  out += R.dense_rules("pooler.dense", P.join(P.HEAD, P.POOLER), bias=True,
                       group="pooler")
  if cfg.sentence_classes:  # the same pooler, as the sentence head's
    out += R.dense_rules("pooler.dense", P.join(P.SENTENCE_HEAD, P.POOLER), bias=True,
                         group="nsp_pooler")
    out += R.dense_rules("cls.seq_relationship", P.join(P.SENTENCE_HEAD, P.HEAD_OUT),
                         bias=True, group="nsp")
  out += R.dense_rules("cls.predictions.transform.dense", P.join(P.LM_HEAD, P.TRANSFORM),
                       bias=True, group="mlm")
  out += R.norm_rules("cls.predictions.transform.LayerNorm",
                      P.join(P.LM_HEAD, P.TRANSFORM_NORM), bias=True, group="mlm")
  out.append(R.Rule("cls.predictions.bias", P.join(P.LM_HEAD, P.BIAS), "vector", "mlm"))
  out += R.dense_rules("classifier", P.join(P.HEAD, P.HEAD_OUT), bias=True,
                       group="classifier")
  out += R.dense_rules("qa_outputs", P.join(P.HEAD, P.HEAD_OUT), bias=True, group="qa")
  return out


FAMILY = Family(
    model_type="bert", family="encoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="bert.",
    base_architecture="BertModel", base_groups=("base", "pooler", "nsp_pooler"),
    architectures={"BertModel": ("base", "pooler"),
                   "BertForMaskedLM": ("base", "mlm"),
                   "BertForPreTraining": ("base", "nsp_pooler", "mlm", "nsp"),
                   "BertForNextSentencePrediction": ("base", "nsp_pooler", "nsp"),
                   "BertForSequenceClassification": ("base", "pooler", "classifier"),
                   "BertForTokenClassification": ("base", "classifier"),
                   "BertForQuestionAnswering": ("base", "qa")},
    # Tied copies: the MLM decoder is the word embedding table plus the bias.
    tied={"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    # The next-sentence head of a checkpoint whose config.json does not name
    # a class with one is dropped (sentence_classes=0: nowhere to load it).
    ignored=(r"^embeddings\.position_ids$", r"^cls\.seq_relationship\."),
    tasks={"classification": "BertForSequenceClassification",
           "regression": "BertForSequenceClassification",
           "token_classification": "BertForTokenClassification",
           "span_qa": "BertForQuestionAnswering"},
    # Dense + tanh over [CLS] (the pooler), then the classifier.
    sequence_pooling="pooler",
)
