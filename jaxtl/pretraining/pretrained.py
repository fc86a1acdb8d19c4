"""Any pretrained model by path: a jaxtl workdir or checkpoint, or a Hugging
Face model folder (converted on the fly), as (config, tokenizer, params).

Both training workloads start from one: fine-tuning adapts it to a task,
continued pretraining (``config.init_from`` of a pretraining config) goes on
with its objective on new text. A fine-tuning workdir is one too: its tuned
backbone (intermediate-task transfer; the earlier task's classifier is left
out, a new task gets a new head). Here too is the architecture file a
workdir keeps, which is what makes it loadable.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Any, Callable, Mapping

from flax import traverse_util

from jaxtl import convert, layout
from jaxtl.data import tokenizer_files
from jaxtl.data import sources
from jaxtl.data.tokenizer_files import get_tokenizer
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig, electra, layers, paths
from jaxtl.models.config import computing_in
from jaxtl.train import checkpoint
from jaxtl.train import workdir as workdir_lib


# Fields a resumed run may change: they shape no parameter.
RUNTIME_FIELDS = ("dropout_rate", "attention_dropout_rate", "lora_dropout", "dtype",
                  "remat", "attention_impl", "norm_impl", "row_major_dots", "init_std")


# model_config.json's entry for a pretrainer's second model (ELECTRA's
# generator), beside the fields of the model that transfers.
GENERATOR_KEY = "generator"


def _recorded(cfg: TransformerConfig) -> dict[str, Any]:
  """``cfg`` as ``model_config.json`` holds it (tuples as lists)."""
  return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _architecture_diff(old: dict[str, Any], new: dict[str, Any], where: str = ""
                       ) -> list[str]:
  """The fields that shape parameters and differ (fields added since ``old``
  was written count as their defaults)."""
  old = {**_recorded(TransformerConfig()), **old}
  return [f"{where}{k}: {old.get(k)!r} there, {new.get(k)!r} here"
          for k in sorted(old.keys() | new.keys())
          if k not in RUNTIME_FIELDS and k != GENERATOR_KEY and old.get(k) != new.get(k)]


def save_model_config(cfg: TransformerConfig, workdir: str,
                      generator: TransformerConfig | None = None,
                      asked: Mapping[str, Any] | None = None) -> None:
  """Writes the architecture, so the workdir can be loaded (fine-tuned, continued).

  ``generator``: an ELECTRA pretrainer's generator, recorded under
  ``"generator"`` so that it can be exported too (:func:`load_generator`).
  ``asked``: the config's model section. Where its dtype is ``auto``, the
  record keeps ``auto`` (and the row-major choice as asked), not what it
  resolved to on this machine: a program that loads the workdir elsewhere
  (``jaxtl generate`` on a GPU, say, after pretraining on a bf16 CPU)
  then picks the precision that pays there
  (:func:`jaxtl.models.config.precision`).
  A workdir that already holds checkpoints of another architecture is
  refused (:class:`jaxtl.train.workdir.WorkdirConflict`) before anything is
  overwritten: resuming it would fail on every checkpoint, and starting over
  would rotate the other model's checkpoints away.
  """
  path = layout.model_config_file(workdir)
  new = _recorded(cfg)
  if generator is not None:
    new[GENERATOR_KEY] = _recorded(generator)
  if asked and asked.get("dtype") == "auto":
    for record in (new, new.get(GENERATOR_KEY, {})):
      record.update(dtype="auto", row_major_dots=bool(asked.get("row_major_dots", False)))
  if os.path.exists(path) and workdir_lib.holds_checkpoints(workdir):
    with open(path) as f:
      old = json.load(f)
    diff = _architecture_diff(old, new)
    if GENERATOR_KEY in old and GENERATOR_KEY in new:  # older workdirs lack it
      diff += _architecture_diff(old[GENERATOR_KEY], new[GENERATOR_KEY], "generator.")
    if diff:
      raise workdir_lib.WorkdirConflict(
          f"{workdir} holds checkpoints of another model ({'; '.join(diff)}), "
          f"recorded in {path}. Resume it with its own model settings, or pass "
          "another --workdir for this one.")
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(new, f, indent=1)
  os.replace(tmp, path)


def _config_from(values: dict[str, Any]) -> TransformerConfig:
  values = {k: v for k, v in values.items() if k != GENERATOR_KEY}
  values["lora_targets"] = tuple(values.get("lora_targets", ()))
  # A workdir trained under auto decides again here, unsaid: fine-tuning,
  # prediction and continued pretraining then decide (and say) their own.
  return TransformerConfig.from_mapping(values, keep_float32=None)


def _hub_hint(path: str) -> str:
  """What to do when ``path`` reads as a Hub name (``gpt2``,
  ``google/t5-small``: at most two parts, the first no folder here)."""
  parts = path.split("/")
  if len(parts) > 2 or not re.fullmatch(r"[\w.-]+", parts[0]) or os.path.exists(parts[0]):
    return ""
  return ("; a Hub name is not downloaded: save the model to a folder with "
          "transformers' save_pretrained where there is network, and pass the folder")


def _read_model_config(workdir: str) -> dict[str, Any]:
  path = layout.model_config_file(workdir)
  if not os.path.isdir(workdir):
    what = "a file" if os.path.exists(workdir) else "no such folder"
    raise FileNotFoundError(f"{workdir}: {what}; a model is a jaxtl "
                            f"workdir or a Hugging Face model folder{_hub_hint(workdir)}")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir}: not a model: a jaxtl pretraining or "
                            f"fine-tuning workdir has {layout.MODEL_CONFIG_FILE} (is its run "
                            "started?), a Hugging Face model folder config.json")
  with open(path) as f:
    return json.load(f)


def load_model_config(workdir: str) -> TransformerConfig:
  """The architecture a pretraining workdir was trained with."""
  return _config_from(_read_model_config(workdir))


def load_generator_config(workdir: str) -> TransformerConfig:
  """The generator an ELECTRA pretraining workdir trained beside its
  discriminator; an error naming what to do when it was not recorded."""
  values = _read_model_config(workdir)
  if GENERATOR_KEY not in values:
    raise ValueError(
        f"{layout.model_config_file(workdir)} records no ELECTRA generator "
        f"(no {GENERATOR_KEY!r} entry): the workdir is not an ELECTRA pretraining "
        "run's, or one pretrained before jaxtl recorded the generator. Running "
        "`jaxtl pretrain` on it again with its own config records it (the run "
        "resumes at its last checkpoint); its discriminator exports without it.")
  return _config_from(values[GENERATOR_KEY])


def check_tokenizer(tok: Tokenizer, cfg: TransformerConfig, workdir: str) -> None:
  """A tokenizer whose ids run past the model's token table is not the one
  it was trained with: its ids would index garbage (NaN losses, nonsense
  predictions), so it is an error naming both."""
  if tok.vocab_size > cfg.vocab_size:
    raise ValueError(
        f"the tokenizer ({tok}) has {tok.vocab_size} ids, but the model in {workdir} "
        f"embeds {cfg.vocab_size} tokens ({layout.MODEL_CONFIG_FILE}): not the tokenizer it "
        "was trained with. Use the workdir's own tokenizer/ (or the right "
        "config.tokenizer_path).")


@dataclasses.dataclass
class Pretrained:
  """A loaded model.

  Attributes:
    config: Its architecture.
    tokenizer: The tokenizer it was trained with (or the one asked for).
    params: The backbone's parameters (``build_model(config)``'s tree, its
      LM head included when the checkpoint has one).
    head: Task-head parameters the checkpoint carries: BERT's ``pooler``,
      ELECTRA's ``discriminator_head`` (a classifier from another task never
      fits, so it is left out).
    dropped: What of the checkpoint was left out (a fine-tuning workdir's
      classifier and scalar mix), for the transfer report.
  """
  config: TransformerConfig
  tokenizer: Tokenizer
  params: dict[str, Any]
  head: dict[str, Any]
  dropped: tuple[str, ...] = ()


def load(init_from: str, tokenizer_path: str = "",
         compute_dtype: str = "") -> Pretrained:
  """Loads ``init_from``; ``tokenizer_path`` overrides the model's own
  tokenizer, ``compute_dtype`` (auto, float32, bfloat16; "": as recorded) its
  precision (:func:`jaxtl.models.config.computing_in`)."""
  loaded = _load(init_from, tokenizer_path)
  return dataclasses.replace(loaded, config=computing_in(loaded.config, compute_dtype))


def _load(init_from: str, tokenizer_path: str) -> Pretrained:
  path = sources.expand_path(init_from)
  tok = get_tokenizer(sources.expand_path(tokenizer_path)) if tokenizer_path else None
  if convert.is_hf_folder(path):
    imported = convert.import_hf(path)
    head = {k: v for k, v in imported.head.items()
            if k in (paths.POOLER, paths.DISCRIMINATOR_HEAD)}
    return Pretrained(imported.config, tok or get_tokenizer(path), imported.params, head)
  cfg, tok = load_model_config(path), tok or tokenizer_files.workdir_tokenizer(path)
  check_tokenizer(tok, cfg, path)
  params = checkpoint.load_selected(path)
  if paths.BACKBONE in params:  # a fine-tuning workdir: a TaskModel's tree
    return tuned_backbone(cfg, tok, params)
  if electra.is_electra(params):  # ELECTRA's: the discriminator transfers
    return electra_discriminator(cfg, tok, params)
  # NSP / SOP trained BERT's pooler: a pooled task head starts from it, as
  # from an imported BERT's.
  pooler = params.get(paths.SENTENCE_HEAD, {}).get(paths.POOLER)
  return Pretrained(cfg, tok, params, {} if pooler is None else {paths.POOLER: pooler})


def load_generator(path: str, tokenizer_path: str = "") -> Pretrained:
  """An ELECTRA pretraining workdir's generator, alone: an encoder with a
  BERT-style LM head reading the shared token table
  (:func:`jaxtl.models.electra.generator_as_encoder`), what Hugging Face's
  ``ElectraForMaskedLM`` holds; the discriminator is left out."""
  path = sources.expand_path(path)
  if convert.is_hf_folder(path):
    raise ValueError(f"{path} is a Hugging Face folder: import its generator "
                     "(ElectraForMaskedLM) as any model; this reads a jaxtl workdir")
  cfg = load_generator_config(path)
  tok = (get_tokenizer(sources.expand_path(tokenizer_path)) if tokenizer_path
         else tokenizer_files.workdir_tokenizer(path))
  params = checkpoint.load_selected(path)
  if not electra.is_electra(params):
    raise ValueError(f"{path}'s checkpoint holds no ELECTRA pretrainer (no "
                     f"{' or '.join(electra.PRETRAINING_ONLY)} parameters)")
  cfg, generator = electra.generator_as_encoder(cfg, params)
  kept = (paths.GENERATOR + "/", paths.TOKEN_EMBED + "/")
  dropped = tuple(n for n in traverse_util.flatten_dict(params, sep="/")
                  if not n.startswith(kept))
  return Pretrained(cfg, tok, generator, {}, dropped)


def electra_discriminator(cfg: TransformerConfig, tok: Tokenizer, params: dict[str, Any]
                          ) -> Pretrained:
  """An ELECTRA pretrainer's discriminator: its encoder, and its detection
  head as a head (exported as ElectraForPreTraining; a task has no use for
  it); the generator is left out."""
  encoder, rest = electra.discriminator(params)
  head = {paths.DISCRIMINATOR_HEAD: rest.pop(paths.DISCRIMINATOR_HEAD)}
  return Pretrained(cfg, tok, encoder, head,
                    tuple(traverse_util.flatten_dict(rest, sep="/")))


def tuned_backbone(cfg: TransformerConfig, tok: Tokenizer, params: dict[str, Any]
                   ) -> Pretrained:
  """The backbone of a fine-tuned TaskModel, to start another task from.

  LoRA is merged into the kernels (a new scheme would otherwise drop what
  was learned); BERT's pooler is kept, since a new head may use it; the
  classifier and a scalar mix belong to the old task and are dropped.
  """
  cfg, backbone = layers.without_lora(cfg, params[paths.BACKBONE])
  head = {k: v for k, v in params.get(paths.HEAD, {}).items() if k == paths.POOLER}
  rest = {k: v for k, v in params.items() if k != paths.BACKBONE}
  dropped = tuple(name for name in traverse_util.flatten_dict(rest, sep="/")
                  if not name.startswith(paths.join(paths.HEAD, paths.POOLER) + "/"))
  return Pretrained(cfg, tok, backbone, head, dropped)


def params_loader(abstract: Any, init_params: Any | None, source: str,
                  dropped: tuple[str, ...] = ()
                  ) -> tuple[Callable[[], dict[str, Any]] | None, dict[str, list[str]]]:
  """(the pretrained parameters to load, by path, as ``Workload.init_params``
  takes them; the transfer report).

  Shapes are checked, and what is loaded, discarded and new is logged, now,
  before any training; the loading itself happens on a fresh start only, so
  a resumed run goes on from its own checkpoint. ``dropped``: what
  :func:`load` already left out (an earlier task's head), reported as
  discarded.
  """
  if init_params is None:
    return None, {}
  loaded, report = checkpoint.select_pretrained(abstract, init_params)
  report["discarded"] = sorted([*report["discarded"], *dropped])
  logging.info("from %s: loaded %d tensors; discarded %s; new %s", source,
               len(report["loaded"]), report["discarded"], report["new"])
  return lambda: loaded, report
