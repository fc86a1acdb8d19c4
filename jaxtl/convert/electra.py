"""ELECTRA (``ElectraModel``, ``ElectraForPreTraining``, ``ElectraForMaskedLM``).

Its encoder is BERT's, tensor for tensor, without the pooler. The
discriminator's head (``ElectraForPreTraining``: dense + activation + one
logit per token) becomes ``head/discriminator_head`` (what
:class:`jaxtl.models.electra.DiscriminatorHead` reads); the generator's
(``ElectraForMaskedLM``: dense to the embedding size + GELU + LayerNorm,
then the tied word embeddings plus a bias) is a BERT-style LM head; the
token classifier and ``qa_outputs`` are BERT's (the task head's ``out``).
Checkpoints whose ``embedding_size`` differs from ``hidden_size`` (ELECTRA
small's 128 vs 256) embed at that width and project up
(``embeddings_project``): jaxtl's ``embed_dim`` and the embedder's
``embed_project``; the generator's head then maps back to it.
"""

from __future__ import annotations

from typing import Any

from jaxtl.convert import bert
from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, get
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig

GENERATOR_CLASS = "ElectraForMaskedLM"


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  d, e = get(hf, "hidden_size"), hf.get("embedding_size", get(hf, "hidden_size"))
  if GENERATOR_CLASS in (hf.get("architectures") or []) and hf.get("hidden_act",
                                                                   "gelu") != "gelu":
    raise ValueError(f"{GENERATOR_CLASS}'s head always uses GELU, and jaxtl's "
                     f"uses hidden_act={hf['hidden_act']!r} for both")
  return bert.config_from_hf(hf).replace(embed_dim=0 if e == d else e)


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  return {**bert.config_to_hf(cfg), "model_type": "electra",
          "embedding_size": cfg.embed_width}


# BERT's groups that ELECTRA shares name for name: the encoder, the token
# classifier (dropout + ``classifier``) and span QA's ``qa_outputs``.
_FROM_BERT = ("base", "classifier", "qa")


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  base = [r for r in bert.rules(cfg) if r.group in _FROM_BERT]
  head = P.join(P.HEAD, P.DISCRIMINATOR_HEAD)
  if cfg.embed_width != cfg.d_model:
    base += R.dense_rules("embeddings_project", P.join(P.STACK, P.EMBEDDER, P.EMBED_PROJECT),
                          bias=True)
  return [
      *base,
      *R.dense_rules("discriminator_predictions.dense", P.join(head, P.TRANSFORM),
                     bias=True, group="discriminator"),
      *R.dense_rules("discriminator_predictions.dense_prediction",
                     P.join(head, P.LOGITS), bias=True, group="discriminator"),
      *R.dense_rules("generator_predictions.dense", P.join(P.LM_HEAD, P.TRANSFORM),
                     bias=True, group="mlm"),
      *R.norm_rules("generator_predictions.LayerNorm", P.join(P.LM_HEAD, P.TRANSFORM_NORM),
                    bias=True, group="mlm"),
      R.Rule("generator_lm_head.bias", P.join(P.LM_HEAD, P.BIAS), "vector", "mlm"),
  ]


def discriminator_head_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
  head, d = P.join(P.HEAD, P.DISCRIMINATOR_HEAD), cfg.d_model
  return {P.join(head, P.TRANSFORM, P.KERNEL): (d, d), P.join(head, P.TRANSFORM, P.BIAS): (d,),
          P.join(head, P.LOGITS, P.KERNEL): (d, 1), P.join(head, P.LOGITS, P.BIAS): (1,)}


FAMILY = Family(
    model_type="electra", family="encoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="electra.",
    base_architecture="ElectraModel", base_groups=("base",),
    architectures={"ElectraModel": ("base",),
                   "ElectraForPreTraining": ("base", "discriminator"),
                   GENERATOR_CLASS: ("base", "mlm"),
                   "ElectraForTokenClassification": ("base", "classifier"),
                   "ElectraForQuestionAnswering": ("base", "qa")},
    tied={"generator_lm_head.weight": "embeddings.word_embeddings.weight"},
    ignored=(r"^embeddings\.position_ids$",),
    # Its sequence classifier (dense + GELU + out_proj on [CLS]) is none of
    # jaxtl's poolings.
    tasks={"token_classification": "ElectraForTokenClassification",
           "span_qa": "ElectraForQuestionAnswering"},
    head_shapes=discriminator_head_shapes,
)
