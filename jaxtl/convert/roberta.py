"""RoBERTa (``RobertaModel``, ``RobertaForMaskedLM`` and the task classes).

BERT's architecture with one token type and other tensor names for the
heads. Its positions start at ``padding_idx + 1`` (pad id 1, so at 2):
row ``p + 2`` of its table is jaxtl's position ``p``, so the import drops
the two rows no real token reads and the export writes them back as zeros
(``transformers`` computes positions from the pad id, so an exported
model's inputs must use 1 for padding, as RoBERTa's tokenizer does).
The sequence classifier (dense + tanh over ``<s>``, then ``out_proj``) is
jaxtl's ``pooling="pooler"`` head.

An encoder exports as BERT unless ``model_type="roberta"`` is asked for:
both compute the same, and BERT's class reads positions from 0 whatever
the pad id.
"""

from __future__ import annotations

from typing import Any

from jaxtl.convert import bert
from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, get
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig

PAD_ID = 1  # RoBERTa's padding_idx: positions start after it
POSITION_OFFSET = PAD_ID + 1


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  if hf.get("pad_token_id", PAD_ID) != PAD_ID:
    raise ValueError(f"config.json: pad_token_id={hf['pad_token_id']}; jaxtl reads "
                     f"RoBERTa position tables whose padding_idx is {PAD_ID}")
  positions = get(hf, "max_position_embeddings") - POSITION_OFFSET
  return bert.config_from_hf({**hf, "max_position_embeddings": positions,
                              "type_vocab_size": hf.get("type_vocab_size", 1),
                              "architectures": []})


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  return {**bert.config_to_hf(cfg), "model_type": "roberta",
          "max_position_embeddings": cfg.max_len + POSITION_OFFSET,
          "pad_token_id": PAD_ID, "bos_token_id": 0, "eos_token_id": 2}


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  out = bert.encoder_rules(cfg, position_rows=POSITION_OFFSET)
  out += R.dense_rules("pooler.dense", P.join(P.HEAD, P.POOLER), bias=True,
                       group="pooler")
  out += R.dense_rules("lm_head.dense", P.join(P.LM_HEAD, P.TRANSFORM), bias=True,
                       group="mlm")
  out += R.norm_rules("lm_head.layer_norm", P.join(P.LM_HEAD, P.TRANSFORM_NORM),
                      bias=True, group="mlm")
  out.append(R.Rule("lm_head.bias", P.join(P.LM_HEAD, P.BIAS), "vector", "mlm"))
  # The sequence classifier: BERT's pooler and classifier under other names.
  out += R.dense_rules("classifier.dense", P.join(P.HEAD, P.POOLER), bias=True,
                       group="classification_head")
  out += R.dense_rules("classifier.out_proj", P.join(P.HEAD, P.HEAD_OUT), bias=True,
                       group="classification_head")
  out += R.dense_rules("classifier", P.join(P.HEAD, P.HEAD_OUT), bias=True,
                       group="classifier")
  out += R.dense_rules("qa_outputs", P.join(P.HEAD, P.HEAD_OUT), bias=True, group="qa")
  return out


FAMILY = Family(
    model_type="roberta", family="encoder", exported_unasked=False,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="roberta.",
    base_architecture="RobertaModel", base_groups=("base", "pooler"),
    # The sequence classifier first: with a pooler and an output layer, a
    # fine-tuned model is one (the default export picks the first fit).
    architectures={"RobertaForSequenceClassification": ("base", "classification_head"),
                   "RobertaModel": ("base", "pooler"),
                   "RobertaForMaskedLM": ("base", "mlm"),
                   "RobertaForTokenClassification": ("base", "classifier"),
                   "RobertaForQuestionAnswering": ("base", "qa")},
    tied={"lm_head.decoder.weight": "embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    ignored=(r"^embeddings\.(position|token_type)_ids$",),
    tasks={"classification": "RobertaForSequenceClassification",
           "regression": "RobertaForSequenceClassification",
           "token_classification": "RobertaForTokenClassification",
           "span_qa": "RobertaForQuestionAnswering"},
    # Dense + tanh over <s> (classifier.dense), then classifier.out_proj.
    sequence_pooling="pooler",
)
