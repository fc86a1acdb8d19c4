"""Fine-tuned models no stock Hugging Face class computes, exported with
jaxtl's modeling file, which ``transformers`` runs with ``trust_remote_code``.

A task head that pools otherwise than the family's classifier (mean, last,
first or concat), reads an ELMo scalar mix of all layers, or sits on an
encoder-decoder's encoder, and any model with Houlsby adapters, is the
family's stock backbone (``BertModel``, ``GPT2Model``, ``T5EncoderModel``...)
plus jaxtl's head, in :mod:`jaxtl.convert.modeling_jaxtl`. The export copies
that file into the folder, naming the backbone in it, and registers its
class in ``config.json``'s ``auto_map``, the way ``transformers`` loads
custom models::

  AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)

``config.json`` is the backbone's own (its ``hidden_size``...), plus
``jaxtl_head``: what the head computes, under ``model_type`` ``jaxtl``
(:data:`MODEL_TYPE`, its config class in the file too): loaded without
``trust_remote_code``, ``transformers`` stops and asks for it, where the
backbone's own type (``bert``) would load the stock class with a random head
and nothing but a load report to say so. The backbone's tensors keep their
stock names under ``backbone.``; the head's are ``pooler``, ``classifier``,
``scalar_mix.{weights,gamma}`` and ``adapters.{i}.{down,up}``. An LM with
adapters (generation, text_to_text) is the stock LM class with the adapters
added (``JaxtlAdaptedLM``), its tensors under their stock names.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable

import numpy as np

from jaxtl.convert import hf
from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, SpecialIds, TaskHead
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig

MODELING_FILE = "modeling_jaxtl.py"
_MODULE = MODELING_FILE.removesuffix(".py")
MODEL_TYPE = hf.OWN_MODEL_TYPE  # config.json's model_type: no stock class claims it
CONFIG_CLASS = "JaxtlConfig"
# The class per task kind that has a head, and the auto class loading it.
HEAD_CLASSES = {
    "classification": ("JaxtlForSequenceClassification",
                       "AutoModelForSequenceClassification"),
    "regression": ("JaxtlForSequenceClassification", "AutoModelForSequenceClassification"),
    "token_classification": ("JaxtlForTokenClassification",
                             "AutoModelForTokenClassification"),
    "span_qa": ("JaxtlForQuestionAnswering", "AutoModelForQuestionAnswering")}
ADAPTED_LM = "JaxtlAdaptedLM"
CLASSES = frozenset({cls for cls, _ in HEAD_CLASSES.values()} | {ADAPTED_LM})
_LM_AUTO = {"decoder": "AutoModelForCausalLM", "encoder_decoder": "AutoModelForSeq2SeqLM"}
BACKBONE_PREFIX = "backbone."
_BACKBONE_LINE = re.compile(r'^BACKBONE = ".*"$', re.M)
# The kernel of the projection whose output each sublayer's adapter reads
# (jaxtl's TransformerBlock: x + dropout(adapter(sublayer(x)))).
_ADAPTED = {P.SELF_ATTENTION: P.kernel(P.join(P.SELF_ATTENTION, P.OUT)),
            P.MLP: P.join(P.MLP, P.WO, P.KERNEL)}
_ADAPTER = re.compile(rf"^(.*/)({'|'.join(_ADAPTED)}){re.escape(P.adapter(''))}/")


def modeling_file(backbone: str) -> str:
  """The modeling file's source, built on the stock class ``backbone``."""
  path = os.path.join(os.path.dirname(__file__), MODELING_FILE)
  with open(path, encoding="utf-8") as f:
    source = f.read()
  source, n = _BACKBONE_LINE.subn(f'BACKBONE = "{backbone}"', source)
  assert n == 1, f"{path}: no single BACKBONE line"
  return source


def _auto_fields(cls: str, auto_class: str, head: dict[str, Any]) -> dict[str, Any]:
  """``config.json`` fields that make ``auto_class`` load ``cls`` from the
  file, and only from it."""
  return {"architectures": [cls], "model_type": MODEL_TYPE,
          "auto_map": {"AutoConfig": f"{_MODULE}.{CONFIG_CLASS}",
                       auto_class: f"{_MODULE}.{cls}"},
          "jaxtl_head": head}


def _renamed(name: str, family: Family) -> str:
  """A base tensor's name in ``family.head_backbone``."""
  for old, new in family.head_backbone_names:
    if name.startswith(old):
      return new + name[len(old):]
  return name


def _backbone_rules(cfg: TransformerConfig, family: Family) -> list[R.Rule]:
  """The family's base tensors, named as ``head_backbone`` under ``backbone.``."""
  return [dataclasses.replace(r, hf=BACKBONE_PREFIX + _renamed(r.hf, family))
          for r in family.rules(cfg) if r.group == "base"]


def _head_rules(pooling: str, mix_layers: int) -> list[R.Rule]:
  out = R.dense_rules("classifier", P.join(P.HEAD, P.HEAD_OUT), bias=True)
  if pooling == "pooler":
    out += R.dense_rules("pooler", P.join(P.HEAD, P.POOLER), bias=True)
  if mix_layers:
    out += [R.Rule(f"scalar_mix.{name}", P.join(P.SCALAR_MIX, name), "vector")
            for name in (P.MIX_WEIGHTS, P.MIX_GAMMA)]
  return out


def _adapters(cfg: TransformerConfig, flat: dict[str, np.ndarray],
              table: list[R.Rule], name: Callable[[R.Rule], str]
              ) -> tuple[list[R.Rule], dict[str, Any]]:
  """Rules for every adapter's tensors (``adapters.{i}.{down,up}``) and the
  ``jaxtl_head`` entry naming the module each follows (by ``name(rule)``, the
  name its projection's weight has in the exported class)."""
  at = {r.jax: r for r in table}
  found = sorted({(m.group(1), m.group(2)) for k in flat if (m := _ADAPTER.match(k))})
  out, sites = [], []
  for i, (where, sublayer) in enumerate(found):
    projection = at[where + _ADAPTED[sublayer]]
    sites.append(name(projection).removesuffix(".weight"))
    for part in (P.ADAPTER_DOWN, P.ADAPTER_UP):
      out += R.dense_rules(f"adapters.{i}.{part}",
                           P.join(f"{where}{P.adapter(sublayer)}", part), bias=True)
  head = {"dim": cfg.adapter_dim, "activation": cfg.activation, "sites": sites}
  return out, ({"adapters": head} if sites else {})


def _flat(params: dict[str, Any]) -> dict[str, np.ndarray]:
  """A TaskModel's parameters as one flat dict: backbone paths bare, the head
  under ``head/``, the scalar mix under ``scalar_mix/``."""
  flat = hf.flat_tree(params[P.BACKBONE], params.get(P.HEAD) or {})
  flat.update({P.join(P.SCALAR_MIX, k): np.asarray(v)
               for k, v in (params.get(P.SCALAR_MIX) or {}).items()})
  return flat


def _dump(table: list[R.Rule], flat: dict[str, np.ndarray], what: str
          ) -> dict[str, np.ndarray]:
  extra = sorted(set(flat) - {r.jax for r in table})
  if extra:
    raise ValueError(f"parameters with no place in {what}: "
                     f"{R._describe(extra)}")  # pylint: disable=protected-access
  return R.dump(table, flat)


def export_head(out: str | os.PathLike, cfg: TransformerConfig, params: Any, spec: TaskHead,
                family: Family, *, pooling: str, special_ids: SpecialIds | None,
                config_fields: dict[str, Any]) -> str:
  """Writes a TaskModel with a head (classification, regression, tagging, span
  QA) as the stock backbone + jaxtl's head class; returns the class's name.

  ``params`` is the TaskModel's tree (LoRA merged); ``pooling`` the resolved
  one ("" for a head that pools nothing: tagging, span QA); ``config_fields``
  more ``config.json`` fields (``problem_type``). The folder holds
  ``config.json``, ``model.safetensors`` and the modeling file.
  """
  cls, auto_class = HEAD_CLASSES[spec.kind]
  backbone_class = family.head_backbone or family.base_architecture
  fields = hf.hf_config(cfg, family.model_type)  # an error when HF has no such backbone
  flat = _flat(params)
  mix = len(flat.get(P.join(P.SCALAR_MIX, P.MIX_WEIGHTS), ()))
  backbone = _backbone_rules(cfg, family)
  adapters, adapter_head = _adapters(cfg, flat, backbone, lambda r: r.hf)
  table = backbone + adapters + _head_rules(pooling, mix)
  tensors = _dump(table, flat, f"{cls} on {backbone_class}")
  if special_ids is not None and family.special_ids is not None:
    fields.update(family.special_ids(cfg, special_ids))
  if spec.kind != "span_qa":
    fields.update(hf.label_fields(flat, tuple(spec.label_names or ())))
  fields.update(config_fields)
  head = {"kind": spec.kind, "pooling": pooling, "scalar_mix": mix,
          "dropout": spec.head_dropout, "token_types": cfg.type_vocab_size > 0,
          **adapter_head}
  fields.update(_auto_fields(cls, auto_class, head))
  hf.write_folder(os.fspath(out), fields, tensors,
                  {MODELING_FILE: modeling_file(backbone_class)})
  return cls


def adapted_lm(cfg: TransformerConfig, params: Any, family: Family,
               architecture: str) -> dict[str, Any]:
  """:func:`jaxtl.convert.hf.export_hf` arguments that write an LM with
  adapters as the stock ``architecture`` plus them (``JaxtlAdaptedLM``)."""
  flat = hf.flat_tree(params, {})
  groups = family.architectures[architecture]
  table = [r for r in family.rules(cfg) if r.group in groups]
  prefix = family.prefix(architecture)
  name = lambda r: (prefix if r.group in family.base_groups else "") + r.hf
  adapters, head = _adapters(cfg, flat, table, name)
  fields = _auto_fields(ADAPTED_LM, _LM_AUTO[cfg.family], head)
  return {"extra_rules": adapters, "config_fields": fields,
          "files": {MODELING_FILE: modeling_file(architecture)}}
