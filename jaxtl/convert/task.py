"""Fine-tuned models (:class:`jaxtl.models.heads.TaskModel`) as Hugging Face
folders: the stock task class where one computes what the model does, else
the stock backbone plus jaxtl's head in a modeling file of its own.

A fine-tuning workdir says what its head computes in ``task.json`` (kind,
label names, pooling, scalar mix). Each family's table
(:attr:`jaxtl.convert.family.Family.tasks`) names the stock class per task
kind: ``BertForSequenceClassification`` for BERT's pooler,
``GPT2ForSequenceClassification`` for GPT-2's last token, the token
classifiers, QA heads and LMs. What no stock class computes (another
pooling, a scalar mix, adapters, a classifier on T5's encoder) is written
with jaxtl's modeling file (:mod:`jaxtl.convert.remote_code`), which
``transformers`` loads with ``trust_remote_code=True``. Either way the labels
go into ``config.json`` and the tensors through the family's rule table.
LoRA is merged into the kernels first.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn

from jaxtl.convert import hf, remote_code
from jaxtl.convert.family import Family, SpecialIds, TaskHead
from jaxtl.models import layers, paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.heads import default_pooling

# HF's problem_type for the task kinds whose head pools one vector per sequence.
PROBLEM_TYPES = {"classification": "single_label_classification",
                 "regression": "regression"}
SEQUENCE_KINDS = tuple(PROBLEM_TYPES)


def _stock_class(cfg: TransformerConfig, kind: str, mixed: bool, family: Family,
                 pooling: str, tokenizer: Any) -> str | None:
  """The stock class computing what the fine-tuned model computes, or None
  when only jaxtl's head class does (an LM's adapters join its stock class).
  ``pooling`` is "" for a head that pools nothing (tagging, span QA)."""
  arch = family.tasks.get(kind)
  if kind in remote_code.HEAD_CLASSES and (mixed or cfg.adapter_dim):
    return None
  if arch and pooling:
    if pooling != family.sequence_pooling:
      return None
    if pooling == "last" and not _pad_is_not_eos(tokenizer):
      return None
  return arch


def _pad_is_not_eos(tokenizer: Any) -> bool:
  """Whether GPT-2's sequence classifier pools the token jaxtl's "last" does.

  jaxtl's "last" pooling takes the last real token, and a decoder's task
  inputs end with EOS (``jaxtl.tasks.features.frame``, a layer above this
  one); HF skips every trailing pad id instead (``pad_token_id``), so the two
  agree only when EOS is not the pad id.
  """
  return tokenizer is not None and tokenizer.pad_id != tokenizer.eos_id


def _check_representable(params: Any) -> None:
  """An error for parameters no export has a place for."""
  unknown = sorted(set(params) - {paths.BACKBONE, paths.HEAD, paths.SCALAR_MIX})
  if unknown:
    raise ValueError(f"parameters beside {paths.BACKBONE}/, {paths.HEAD}/ and "
                     f"{paths.SCALAR_MIX}/ have no Hugging Face place: {unknown}")


def export_task_hf(out: str | os.PathLike, cfg: TransformerConfig, params: Any,
                   spec: TaskHead, *, tokenizer: Any = None,
                   model_type: str | None = None) -> str:
  """Writes a fine-tuned TaskModel as a Hugging Face folder computing the same.

  The stock class where one computes it (no remote code); else the stock
  backbone plus jaxtl's head class in ``modeling_jaxtl.py``, registered in
  ``config.json``'s ``auto_map`` (load with ``trust_remote_code=True``).

  Args:
    out: The folder to write.
    cfg: The model's config (LoRA, if any, is merged into the kernels).
    params: ``{"backbone": ..., "head": ...}`` (and ``scalar_mix``), the
      TaskModel's parameters.
    spec: The task (a :class:`jaxtl.tasks.spec.TaskSpec`).
    tokenizer: The model's tokenizer: its special ids go into ``config.json``
      (an encoder-decoder's default: jaxtl's, pad 0 and EOS 1), and GPT-2's
      sequence classifier needs a pad id that is not its EOS.
    model_type: The Hugging Face family (``roberta``...); default: the first
      that computes the same (:func:`jaxtl.convert.hf.export_family`).

  Returns:
    The class written (``config.json``'s ``architectures``).
  """
  params = nn.unbox(params)
  _check_representable(params)
  cfg, backbone = layers.without_lora(cfg, params[paths.BACKBONE])
  params = {**params, paths.BACKBONE: backbone}
  family = hf.export_family(cfg, model_type)
  pooled = spec.kind in SEQUENCE_KINDS  # the pooling as fine-tuning resolved it
  pooling = (spec.pooling or default_pooling(cfg.family)) if pooled else ""
  ids = None if tokenizer is None else SpecialIds.of(tokenizer)
  mixed = spec.scalar_mix or paths.SCALAR_MIX in params
  arch = _stock_class(cfg, spec.kind, mixed, family, pooling, tokenizer)
  fields = {"problem_type": PROBLEM_TYPES[spec.kind]} if pooled else {}
  if arch is None and spec.kind in remote_code.HEAD_CLASSES:
    return remote_code.export_head(out, cfg, params, spec, family, pooling=pooling,
                                   special_ids=ids, config_fields=fields)
  if arch is None or mixed:
    raise ValueError(f"a {cfg.family} model fine-tuned for {spec.kind!r}"
                     f"{' with a scalar mix' if mixed else ''} has no Hugging Face "
                     f"{family.model_type} class; exportable kinds: "
                     f"{sorted(set(family.tasks) | set(remote_code.HEAD_CLASSES))}")
  if pooling == "last":
    fields["pad_token_id"] = tokenizer.pad_id  # GPT-2's classifier finds the last token by it
  extra = remote_code.adapted_lm(cfg, backbone, family, arch) if cfg.adapter_dim else {}
  fields.update(extra.pop("config_fields", {}))
  hf.export_hf(out, cfg, backbone, head=params.get(paths.HEAD), architecture=arch,
               label_names=tuple(spec.label_names or ()), config_fields=fields,
               model_type=family.model_type, special_ids=ids, **extra)
  return fields.get("architectures", [arch])[0]
