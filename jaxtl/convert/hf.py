"""Hugging Face model folders in and out: BERT, RoBERTa, DistilBERT, ELECTRA,
GPT-2, T5 and BART.

``import_hf(folder)`` reads ``config.json`` and the weights
(``model.safetensors``, sharded or not, or ``pytorch_model.bin``) into a
:class:`TransformerConfig`, the backbone's parameter tree and the task-head
parameters the checkpoint has (BERT's pooler; a task class's classifier,
``score`` or ``qa_outputs``).
``export_hf(folder, config, params)`` writes a folder that ``transformers``
loads with no missing or unexpected keys. Both go through one tensor table
per family (:mod:`jaxtl.convert.rules`), and check every shape and name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.flax
import safetensors.numpy
from flax import traverse_util

from jaxtl.convert import bart, bert, distilbert, electra, gpt2, roberta, rules, t5
from jaxtl.convert.family import Family, SpecialIds
from jaxtl.models import layers, paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.family import family_of
from jaxtl.models.transformer import build_model

log = logging.getLogger(__name__)

# In the order an export tries them: a jaxtl model exports as the first of
# its family's that computes the same and places the most of its tensors (an
# encoder: BERT; DistilBERT when it has no token types; ELECTRA when it holds
# the discriminator's head; RoBERTa only when asked for. An encoder-decoder:
# T5 with relative positions, BART with learned ones).
FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    bert.FAMILY, distilbert.FAMILY, roberta.FAMILY, electra.FAMILY, gpt2.FAMILY,
    t5.FAMILY, bart.FAMILY)}
_SAFETENSORS, _TORCH = "model.safetensors", "pytorch_model.bin"
# Rule groups of a classifier whose outputs are labels (id2label in config.json).
_LABEL_GROUPS = {"classifier", "score", "classification_head"}
# Architecture fields a config must keep through HF's config to be exportable.
# (embed_width, not embed_dim: embed_dim=d_model is the same model as 0.)
_ARCH_FIELDS = ("family", "vocab_size", "d_model", "embed_width", "num_heads", "head_dim",
                "mlp_dim", "num_layers", "decoder_layers", "max_len", "position",
                "relative_buckets", "relative_max_distance", "type_vocab_size",
                "activation", "gated_mlp", "norm", "norm_eps", "pre_norm", "embed_norm",
                "use_bias", "scale_attention", "tie_embeddings", "scale_tied_logits",
                "lm_head_transform", "lm_head_bias", "decoder_start")


@dataclasses.dataclass
class Imported:
  """A converted checkpoint.

  Attributes:
    config: The model's TransformerConfig.
    params: The backbone's parameters (the tree ``build_model(config)`` uses;
      the LM head only when the checkpoint has one).
    head: Task-head parameters found in the checkpoint (``pooler``, ``out``),
      laid out as :class:`jaxtl.models.heads.ClassifierHead` names them
      (GPT-2's ``score`` has no bias).
    architecture: The checkpoint's class name per ``config.json``.
    groups: The rule groups that were present (``base``, ``mlm``, ``pooler``...).
    hf_config: ``config.json`` as read.
    special_ids: The special ids ``config.json`` names, for an export of
      the same model (``export_hf(..., special_ids=imported.special_ids)``).
  """
  config: TransformerConfig
  params: dict[str, Any]
  head: dict[str, Any]
  architecture: str
  groups: tuple[str, ...]
  hf_config: dict[str, Any]

  @property
  def special_ids(self) -> SpecialIds:
    return SpecialIds.from_hf(self.hf_config)


class HFFolderError(ValueError):
  """A Hugging Face model folder that cannot be read: the message names the
  file and what is wrong with it."""


def is_hf_folder(path: str | os.PathLike) -> bool:
  """True when ``path`` holds a ``config.json``: a Hugging Face model folder
  (a jaxtl workdir never has one), even a broken one, so that reading it
  says what is wrong with it rather than that it is no jaxtl workdir."""
  return os.path.isfile(os.path.join(os.fspath(path), "config.json"))


def _read_json(file: str) -> Any:
  """A JSON file's contents; an error naming the file when it is not JSON."""
  try:
    with open(file, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise HFFolderError(f"{file}: not valid JSON (line {e.lineno} column "
                        f"{e.colno}: {e.msg})") from None
  except UnicodeDecodeError as e:
    raise HFFolderError(f"{file}: not valid JSON (not UTF-8 text: {e.reason} at "
                        f"byte {e.start})") from None


# The model_type of an export whose head is jaxtl's own (jaxtl.convert.remote_code).
OWN_MODEL_TYPE = "jaxtl"


def read_config(path: str | os.PathLike) -> dict[str, Any]:
  """``config.json``: a JSON object naming its ``model_type``."""
  file = os.path.join(os.fspath(path), "config.json")
  if not os.path.isfile(file):
    raise HFFolderError(f"{path}: no config.json (a Hugging Face folder holds "
                        "config.json and its weights)")
  hf_config = _read_json(file)
  if not isinstance(hf_config, dict) or not hf_config.get("model_type"):
    raise HFFolderError(f"{file}: no model_type (the Hugging Face family; jaxtl "
                        f"converts {', '.join(sorted(FAMILIES))})")
  return hf_config


def _reason(e: Exception) -> str:
  """A library's error in a few words: its first line, or its class."""
  line = str(e).strip().split("\n")[0]
  return line if line and len(line) <= 120 else type(e).__name__


def _load_file(file: str) -> dict[str, np.ndarray]:
  """One weights file as float32 numpy (bf16/fp16 checkpoints are upcast)."""
  if file.endswith(".safetensors"):
    try:
      tensors = safetensors.flax.load_file(file)
    except (safetensors.SafetensorError, OSError, ValueError) as e:
      raise HFFolderError(f"{file}: not a readable safetensors file ({_reason(e)})") from e
    return {k: np.asarray(v.astype(jnp.float32) if jnp.issubdtype(v.dtype, jnp.floating)
                          else v) for k, v in tensors.items()}
  try:  # optional: only pytorch_model.bin needs it (pip install 'jaxtl[hf]')
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"reading {file} needs PyTorch (pip install torch); "
                      "a model.safetensors file does not") from e
  try:
    state = torch.load(file, map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    # No common base: pickle's, zipfile's, struct's, torch's own errors.
    raise HFFolderError(f"{file}: not a readable PyTorch checkpoint ({_reason(e)})") from e
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def read_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """All tensors of a model folder, sharded or not, safetensors preferred."""
  path = os.fspath(path)
  for name in (_SAFETENSORS, _TORCH):
    file = os.path.join(path, name)
    if os.path.isfile(file):
      return _load_file(file)
    index = file + ".index.json"
    if os.path.isfile(index):
      listing = _read_json(index)
      if not isinstance(listing, dict) or not isinstance(listing.get("weight_map"), dict):
        raise HFFolderError(f"{index}: no weight_map (tensor name -> shard file)")
      tensors = {}
      for shard in sorted(set(listing["weight_map"].values())):
        shard = os.path.join(path, shard)
        if not os.path.isfile(shard):
          raise HFFolderError(f"{shard}: missing, but {index} lists it")
        tensors.update(_load_file(shard))
      return tensors
  raise HFFolderError(f"{path}: no {_SAFETENSORS} or {_TORCH} (a Hugging Face folder "
                      "holds config.json and its weights, or their sharded "
                      ".index.json)")


def _family(hf_config: dict[str, Any], path: str) -> Family:
  model_type = hf_config["model_type"]
  if model_type == OWN_MODEL_TYPE:
    raise HFFolderError(f"{path} is a jaxtl export with a head of jaxtl's own "
                        "(modeling_jaxtl.py): start from the jaxtl workdir it was "
                        "exported from instead")
  if model_type not in FAMILIES:
    raise HFFolderError(f"{os.path.join(path, 'config.json')}: model_type "
                        f"{model_type!r} is not supported; jaxtl converts "
                        f"{', '.join(sorted(FAMILIES))}")
  return FAMILIES[model_type]


def num_labels(hf_config: dict[str, Any]) -> int:
  """The classifier's output count per ``config.json`` (HF's default is 2)."""
  return len(hf_config.get("id2label") or {}) or hf_config.get("num_labels", 2)


def _jax_shapes(cfg: TransformerConfig, labels: int, family: Family
                ) -> dict[str, tuple[int, ...]]:
  """Every parameter shape of the backbone, plus the BERT head's (pooler, out)
  and the family's own head's."""
  tokens = jnp.ones((1, 1), jnp.int32)
  args = family_of(cfg).forward_args(tokens)
  tree = nn.unbox(jax.eval_shape(build_model(cfg).init, jax.random.key(0), *args))
  shapes = {k: tuple(v.shape) for k, v in
            traverse_util.flatten_dict(tree["params"], sep="/").items()}
  d = cfg.d_model
  for name, outputs in ((paths.POOLER, d), (paths.HEAD_OUT, labels)):
    dense = paths.join(paths.HEAD, name)
    shapes[paths.join(dense, paths.KERNEL)] = (d, outputs)
    shapes[paths.join(dense, paths.BIAS)] = (outputs,)
  if family.head_shapes:
    shapes.update(family.head_shapes(cfg))
  return shapes


def _untie(family: Family, tensors: dict[str, np.ndarray], claimed: set[str],
           path: Any) -> dict[str, np.ndarray]:
  """Drops tied copies (after checking they are copies) and ignored tensors."""
  out = dict(tensors)
  for alias, canonical in family.tied.items():
    if alias in out and alias not in claimed:
      if canonical in out and not np.array_equal(out[alias], out[canonical]):
        raise ValueError(f"{path}: {alias} differs from {canonical}, but jaxtl "
                         "ties them (untied weights are not supported here)")
      del out[alias]
  dropped = sorted(k for k in out if k not in claimed
                   and any(re.search(p, k) for p in family.ignored))
  if dropped:
    log.info("%s: not loading %s", path, ", ".join(dropped))
  return {k: v for k, v in out.items() if k not in dropped}


def import_hf(path: str | os.PathLike) -> Imported:
  """Converts a Hugging Face BERT / GPT-2 / T5 / ELECTRA folder; see the module doc."""
  path = os.fspath(path)
  hf_config = read_config(path)
  family = _family(hf_config, path)
  try:
    cfg = family.config_from_hf(hf_config)
  except ValueError as e:  # a field missing or one jaxtl cannot build: say where
    raise HFFolderError(f"{path}: {e}") from e
  prefix = family.prefix((hf_config.get("architectures") or [""])[0])
  tensors = {k[len(prefix):] if prefix and k.startswith(prefix) else k: v
             for k, v in read_tensors(path).items()}
  table = family.rules(cfg)
  tensors = _untie(family, tensors, {r.hf for r in table}, path)
  flat, groups = rules.load(table, tensors,
                            _jax_shapes(cfg, num_labels(hf_config), family), path)
  in_head = paths.HEAD + "/"
  split = lambda head: traverse_util.unflatten_dict(
      {k.removeprefix(in_head): v for k, v in flat.items()
       if k.startswith(in_head) == head}, sep="/")
  architecture = (hf_config.get("architectures") or ["?"])[0]
  log.info("%s: %s (%s) -> jaxtl %s; groups %s", path, architecture,
           family.model_type, cfg.family, groups)
  return Imported(cfg, split(False), split(True), architecture, tuple(groups),
                  hf_config)


def _unscan(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """``.../layers/...`` tensors with a leading layer axis -> ``.../layer_{i}/...``."""
  out = {}
  for key, value in flat.items():
    if not paths.is_scanned(key):
      out[key] = value
      continue
    parts = key.split("/")
    at = parts.index(paths.LAYERS)
    for i in range(value.shape[0]):
      out[paths.join(*parts[:at], paths.layer(i), *parts[at + 1:])] = value[i]
  return out


def _differences(family: Family, cfg: TransformerConfig) -> list[str]:
  """The architecture fields ``family``'s HF class cannot give ``cfg``."""
  try:
    back = family.config_from_hf(family.config_to_hf(cfg))
  except ValueError as e:  # HF's config cannot even hold it (T5 heads in BART's)
    return [str(e)]
  return [f"{f}={getattr(cfg, f)!r} (a {family.model_type} model has "
          f"{getattr(back, f)!r})" for f in _ARCH_FIELDS
          if getattr(cfg, f) != getattr(back, f)]


def export_family(config: TransformerConfig, model_type: str | None = None,
                  flat: dict[str, np.ndarray] | None = None,
                  architecture: str | None = None) -> Family:
  """The Hugging Face family ``config`` exports as.

  ``model_type``'s when given; else the family of the class asked for; else,
  among its jaxtl family's (in :data:`FAMILIES` order, leaving out those
  exported only when asked for: RoBERTa) those whose class
  computes what ``config`` does, the one whose rules place the most complete
  groups of ``flat`` (the parameters to write), the first on a tie. An
  error names what differs from each when none computes the same.
  """
  candidates = [f for f in FAMILIES.values() if f.family == config.family]
  if model_type is not None:
    family = FAMILIES.get(model_type)
    if family is None or family.family != config.family:
      known = sorted(f.model_type for f in candidates)
      raise ValueError(f"cannot export a {config.family} model as model_type "
                       f"{model_type!r}; known for it: {known}")
    return family
  asked = [f for f in candidates if architecture in f.architectures]
  if asked:
    return asked[0]
  candidates = [f for f in candidates if f.exported_unasked]
  problems = {f.model_type: _differences(f, config) for f in candidates}
  fitting = [f for f in candidates if not problems[f.model_type]]
  if not fitting:
    raise ValueError(f"this {config.family} model has no Hugging Face " + "; nor ".join(
        f"{name} equivalent: " + "; ".join(differ) for name, differ in problems.items()))
  if flat is None:
    return fitting[0]
  return max(fitting, key=lambda f: len(_complete_groups(f.rules(config), flat)))


def _check_exportable(family: Family, cfg: TransformerConfig) -> dict[str, Any]:
  """HF's config for ``cfg``; an error when HF's class would compute something else."""
  differ = _differences(family, cfg)
  if differ:
    raise ValueError(f"this {cfg.family} model has no Hugging Face "
                     f"{family.model_type} equivalent: " + "; ".join(differ))
  return family.config_to_hf(cfg)


def hf_config(config: TransformerConfig, model_type: str | None = None) -> dict[str, Any]:
  """The ``config.json`` fields of the Hugging Face model equal to ``config``."""
  return _check_exportable(export_family(config, model_type), config)


def flat_tree(params: Any, head: Any) -> dict[str, np.ndarray]:
  """Backbone and ``head/...`` parameters as one flat, unscanned numpy dict."""
  flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(
      jax.device_get(params), sep="/").items()}
  flat.update({paths.join(paths.HEAD, k): np.asarray(v) for k, v in
               traverse_util.flatten_dict(jax.device_get(head), sep="/").items()})
  return _unscan(flat)


def _complete_groups(table: list[rules.Rule], flat: dict[str, np.ndarray]) -> set[str]:
  """The rule groups whose every tensor ``flat`` holds."""
  return {g for g in {r.group for r in table}
          if all(r.jax in flat for r in table if r.group == g)}


def _richest_architecture(family: Family, have: set[str]) -> str:
  """The first class holding the most of the complete groups ``have``; the
  bare model when none fits (a fine-tuned backbone without BERT's pooler)."""
  fits = [a for a, g in family.architectures.items() if set(g) <= have]
  return (max(fits, key=lambda a: len(family.architectures[a])) if fits
          else family.base_architecture)


def label_fields(flat: dict[str, np.ndarray], label_names: tuple[str, ...]
                 ) -> dict[str, Any]:
  """``num_labels``, ``id2label`` and ``label2id`` for the classifier's outputs."""
  n = flat[paths.join(paths.HEAD, paths.HEAD_OUT, paths.KERNEL)].shape[-1]
  if label_names and len(label_names) != n:
    raise ValueError(f"{len(label_names)} label names {list(label_names)} for a "
                     f"classifier with {n} outputs")
  names = label_names or tuple(f"LABEL_{i}" for i in range(n))
  if len(set(names)) != n:
    raise ValueError(f"label names must be distinct: {list(names)}")
  return {"num_labels": n, "id2label": {str(i): name for i, name in enumerate(names)},
          "label2id": {name: i for i, name in enumerate(names)}}


def export_hf(path: str | os.PathLike, config: TransformerConfig, params: Any, *,
              head: Any = None, architecture: str | None = None,
              label_names: tuple[str, ...] = (),
              config_fields: dict[str, Any] | None = None,
              model_type: str | None = None,
              special_ids: SpecialIds | None = None,
              extra_rules: Sequence[rules.Rule] = (),
              files: Mapping[str, str] | None = None) -> str:
  """Writes ``config.json`` + ``model.safetensors`` for ``transformers``.

  Args:
    path: Output folder (created; files in it are replaced atomically).
    config: The model's config; it must be one HF's class can express
      (e.g. a BERT export needs post-LN with an embedding norm).
    params: The backbone's parameters (LoRA is merged into the kernels first;
      scanned layers are unstacked).
    head: Task-head parameters (``pooler``, ``out``) for the task classes.
    architecture: The HF class to write; default: the richest one whose
      tensors ``params`` and ``head`` provide.
    label_names: ``id2label`` for a classifier (default ``LABEL_i``).
    config_fields: More ``config.json`` fields (``problem_type``,
      ``pad_token_id``...), written last.
    model_type: The Hugging Face family (``roberta``...); default: the first
      that computes what ``config`` does (:func:`export_family`).
    special_ids: The tokenizer's special ids (``SpecialIds.of(tokenizer)``),
      which ``config.json`` names (an encoder-decoder's pad, EOS and the
      decoder's start, BART's BOS; GPT-2's EOS, BOS and pad); default:
      jaxtl's tokenizers' pad 0 and EOS 1 for encoder-decoders. The family
      decides which it writes (RoBERTa's pad stays 1).
    extra_rules: Tensors beyond the class's own, under the names given (the
      adapters of an LM that jaxtl's modeling file loads).
    files: More files to write beside them, by name (that modeling file).

  Returns:
    The architecture written.
  """
  params, head = nn.unbox(params), nn.unbox(head or {})  # as model.init returns them
  config, params = layers.without_lora(config, params)
  family = export_family(config, model_type, flat_tree(params, head), architecture)
  hf_config = _check_exportable(family, config)
  table = family.rules(config)
  have = _complete_groups(table, flat_tree(params, head))
  if architecture is None:
    architecture = _richest_architecture(family, have)
  if architecture not in family.architectures:
    raise ValueError(f"cannot export as {architecture!r}; known for {family.model_type}: "
                     f"{sorted(family.architectures)}")
  if architecture in family.head_transforms:
    params, head = family.head_transforms[architecture](params, head)
  flat = flat_tree(params, head)
  groups = family.architectures[architecture]
  if architecture == family.base_architecture and not set(groups) <= have:
    log.warning("%s without %s (the model has none): transformers initialises "
                "it at random", architecture, sorted(set(groups) - have))
    groups = tuple(g for g in groups if g in have)
  table = [r for r in table if r.group in groups]
  extra = sorted(set(flat) - {r.jax for r in table} - {r.jax for r in extra_rules}
                 - {r.jax for r in family.rules(config) if r.group not in groups})
  if extra:
    raise ValueError(f"parameters with no place in a {architecture} checkpoint "
                     f"(adapters?): {rules._describe(extra)}")  # pylint: disable=protected-access
  tensors = rules.dump(table, flat)
  in_base = {r.hf for r in table if r.group in family.base_groups}
  prefix = family.prefix(architecture)
  tensors = {(prefix + k if k in in_base else k): v for k, v in tensors.items()}
  tensors.update(rules.dump(extra_rules, flat))
  hf_config["architectures"] = [architecture]
  if special_ids is not None and family.special_ids is not None:
    hf_config.update(family.special_ids(config, special_ids))
  if set(groups) & _LABEL_GROUPS:
    hf_config.update(label_fields(flat, tuple(label_names)))
  hf_config.update(config_fields or {})
  write_folder(os.fspath(path), hf_config, tensors, files)
  return architecture


def write_folder(path: str, hf_config: dict[str, Any], tensors: dict[str, np.ndarray],
                 files: Mapping[str, str] | None = None) -> None:
  """Writes ``config.json``, ``model.safetensors`` and ``files`` (name -> text)
  into a temporary folder first, then moves each file in place."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise NotADirectoryError(f"{path} is a file: an export is a folder (config.json, "
                             "model.safetensors and the tokenizer's files)")
  os.makedirs(path, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=path, prefix=".export-")
  try:
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(hf_config, f, indent=2, sort_keys=True)
    safetensors.numpy.save_file(tensors, os.path.join(tmp, _SAFETENSORS), metadata={"format": "pt"})
    for name, text in (files or {}).items():
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        f.write(text)
    for name in ("config.json", _SAFETENSORS, *(files or {})):
      os.replace(os.path.join(tmp, name), os.path.join(path, name))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
