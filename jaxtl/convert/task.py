"""Fine-tuned models (:class:`jaxtl.models.heads.TaskModel`) as Hugging Face
task classes: ``BertForSequenceClassification``, ``GPT2ForTokenClassification``...

A fine-tuning workdir says what its head computes in ``task.json`` (kind,
label names, pooling, scalar mix). Each family's table
(:attr:`jaxtl.convert.family.Family.tasks`) names the class per task kind;
here the export refuses what that class would compute differently (another
pooling, a scalar mix, adapters) and writes the labels into ``config.json``.
The tensors go through the same rule tables as every other export.
"""

from __future__ import annotations

import os
from typing import Any

from jaxtl.convert import hf
from jaxtl.convert.family import SpecialIds
from jaxtl.models import paths
from jaxtl.models.config import TransformerConfig

# HF's problem_type for the task kinds whose head pools one vector per sequence.
PROBLEM_TYPES = {"classification": "single_label_classification",
                 "regression": "regression"}
SEQUENCE_KINDS = tuple(PROBLEM_TYPES)


def _architecture(cfg: TransformerConfig, spec: Any, model_type: str | None) -> str:
  """The HF class computing what the fine-tuned model computes, or an error."""
  family = hf.export_family(cfg, model_type)
  if spec.kind not in family.tasks:
    raise ValueError(
        f"a {cfg.family} model fine-tuned for {spec.kind!r} has no Hugging Face "
        f"{family.model_type} class computing the same; exportable kinds: "
        f"{sorted(family.tasks)}")
  arch = family.tasks[spec.kind]
  if spec.kind in SEQUENCE_KINDS:
    from jaxtl.models.heads import default_pooling  # pylint: disable=g-import-not-at-top
    pooling = spec.pooling or default_pooling(cfg.family)  # as fine-tuning resolves it
    wanted, how = family.sequence_pooling
    if pooling != wanted:
      raise ValueError(
          f"{arch} pools {how}, which is jaxtl's pooling={wanted!r}; this model "
          f"was fine-tuned with pooling={pooling!r}, which no Hugging Face "
          f"{family.model_type} classifier computes (fine-tune with "
          f"task.pooling={wanted!r} to export it, or pass "
          f"--architecture={family.base_architecture} for the tuned backbone alone)")
  return arch


def _check_representable(cfg: TransformerConfig, params: Any, spec: Any) -> None:
  """Errors for what HF's classes cannot hold (LoRA is merged, so it is fine)."""
  unknown = sorted(set(params) - {paths.BACKBONE, paths.HEAD})
  if spec.scalar_mix or paths.SCALAR_MIX in params:
    raise ValueError("this model's head reads an ELMo scalar mix of all layers; "
                     "Hugging Face classes read the last layer only, so it has no "
                     "Hugging Face equivalent")
  if unknown:
    raise ValueError(f"parameters beside {paths.BACKBONE}/ and {paths.HEAD}/ have no "
                     f"Hugging Face place: {unknown}")
  if cfg.adapter_dim:
    raise ValueError(f"this model has adapters (adapter_dim={cfg.adapter_dim}); "
                     "Hugging Face BERT, GPT-2 and T5 have no adapter layers, and "
                     "adapters (non-linear) cannot be merged into the weights")


def _pad_token_id(tokenizer: Any, arch: str) -> int:
  """``pad_token_id`` for a class that pools the last token that is not it.

  jaxtl's "last" pooling takes the last real token, and a decoder's task
  inputs end with EOS (``jaxtl.tasks.features.frame``, a layer above this
  one); HF skips every trailing pad id instead, so the two agree only when
  EOS is not the pad id.
  """
  if tokenizer is None:
    raise ValueError(f"{arch} finds the last token by pad_token_id: pass the "
                     "tokenizer the model was fine-tuned with")
  if tokenizer.pad_id == tokenizer.eos_id:
    raise ValueError(
        f"the tokenizer's pad id {tokenizer.pad_id} is also its EOS, which ends "
        f"every input, so {arch} (it pools the last token that is not the pad "
        "id) would pool the token before the one jaxtl's 'last' pooling read")
  return int(tokenizer.pad_id)


def export_task_hf(out: str | os.PathLike, cfg: TransformerConfig, params: Any,
                   spec: Any, *, tokenizer: Any = None,
                   model_type: str | None = None) -> str:
  """Writes a fine-tuned TaskModel as the Hugging Face class computing the same.

  Args:
    out: The folder to write.
    cfg: The model's config (LoRA, if any, is merged into the kernels).
    params: ``{"backbone": ..., "head": ...}``, the TaskModel's parameters.
    spec: The task: attributes ``kind``, ``label_names`` (list or None),
      ``pooling`` and ``scalar_mix``, as :class:`jaxtl.tasks.spec.TaskSpec` holds them.
    tokenizer: The model's tokenizer; needed for the pad id of GPT-2's
      sequence classifier; an encoder-decoder's ``config.json`` names its
      special ids (default: jaxtl's, pad 0 and EOS 1).
    model_type: The Hugging Face family (``roberta``...); default: the first
      that computes the same (:func:`jaxtl.convert.hf.export_family`).

  Returns:
    The class written (``config.json``'s ``architectures``).
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  params = nn.unbox(params)
  _check_representable(cfg, params, spec)
  arch = _architecture(cfg, spec, model_type)
  fields: dict[str, Any] = {}
  if spec.kind in SEQUENCE_KINDS:
    fields["problem_type"] = PROBLEM_TYPES[spec.kind]
    if hf.export_family(cfg, model_type).sequence_pooling[0] == "last":
      fields["pad_token_id"] = _pad_token_id(tokenizer, arch)
  labels = tuple(spec.label_names or ())
  return hf.export_hf(out, cfg, params[paths.BACKBONE], head=params.get(paths.HEAD),
                      architecture=arch, label_names=labels, config_fields=fields,
                      model_type=model_type,
                      special_ids=None if tokenizer is None else SpecialIds.of(tokenizer))
