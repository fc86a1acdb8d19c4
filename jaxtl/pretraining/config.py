"""A pretraining run's typed config: the sections a recipe's ConfigDict is
turned into once (:func:`of`), stages included, before the run starts."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from jaxtl import sections
from jaxtl.data.config import DataConfig
from jaxtl.objectives import ObjectiveConfig
from jaxtl.sections import key, section
from jaxtl.train.optim import OptimConfig
from jaxtl.train.sharding import MeshConfig

# The backbone's meaning in both skeletons: its keys are TransformerConfig's.
MODEL = ("the backbone: every TransformerConfig field (jaxtl.models.config says "
         "what each means); recipes start from a preset of jaxtl.configs.models")


@dataclasses.dataclass(frozen=True)
class PretrainTrainConfig:
  """How long and how often a pretraining run goes, in steps."""
  steps: int = key(1000, "optimizer updates in the whole run")
  log_every: int = key(50, "steps between train-metric lines")
  eval_every: int = key(250, "steps between evaluations")
  eval_batches: int = key(20, "batches per evaluation")
  checkpoint_every: int = key(250, "steps between resumable checkpoints; 0: only the "
                                   "last step's and one on SIGTERM")
  keep_checkpoints: int = key(3, "periodic checkpoints kept (older ones are deleted)")
  max_bad_steps: int = key(20, "consecutive non-finite steps that stop the run")
  peak_flops: float = key(0.0, "FLOP/s per device for MFU; 0: looked up in "
                               "jaxtl.train.perf.PEAK_FLOPS")


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """A pretraining run: the backbone, the objective, the corpus, the schedule."""
  seed: int = key(0, "random seed: initialisation, data order, sampling")
  # A TransformerConfig's fields, vocab_size 0 for the tokenizer's: the
  # TransformerConfig is built once that is known (pretrain.model_config_from).
  model: dict[str, Any] = key({}, MODEL)
  vocab_multiple: int = key(128, "the embedding's rows are padded to a multiple of "
                                 "this (shards evenly)")
  init_from: str = key("", "continued pretraining: a jaxtl workdir or Hugging Face "
                           "folder whose weights, tokenizer and architecture the run "
                           "starts from (model then only sets dropout); \"\": none")
  objective: ObjectiveConfig = section(ObjectiveConfig, "the pretraining objective "
                                                        "and its corruption rates")
  data: DataConfig = section(DataConfig)
  optim: OptimConfig = section(OptimConfig)
  train: PretrainTrainConfig = section(PretrainTrainConfig)
  mesh: MeshConfig = section(MeshConfig)
  # In a recipe each stage is a dict of its ``steps`` (adding up to
  # train.steps) and overrides of ``data`` (seq_len, batch_size, source, ...)
  # and ``objective`` keys, e.g. BERT's (dict(steps=900,
  # data=dict(seq_len=128)), dict(steps=100)) with data.seq_len=512; typed,
  # each is a whole Stage (:func:`of`). Evaluation uses data and objective
  # as they are.
  stages: tuple[Stage, ...] = key(
      (), "stages run in order under one schedule, each dict(steps=N, data=..., "
          "objective=...); (): one stage")

  def run_stages(self) -> tuple[Stage, ...]:
    """The stages the run goes through: its own, or one of train.steps."""
    return self.stages or (Stage(self.train.steps, self.data, self.objective),)


@dataclasses.dataclass(frozen=True)
class Stage:
  """A stage of a run: its steps, and the run's data and objective with the
  stage's overrides."""
  steps: int = dataclasses.field(metadata={"meaning": "the stage's optimizer updates"})
  data: DataConfig = dataclasses.field(metadata={"meaning": "the stage's corpus and rows"})
  objective: ObjectiveConfig = dataclasses.field(
      metadata={"meaning": "the stage's objective"})


STAGE_KEYS = ("steps", "data", "objective")
# One tokenizer and one evaluation for the whole run, so eval losses compare.
RUN_WIDE_DATA_KEYS = ("tokenizer", "eval_split")


def of(config: ml_collections.ConfigDict | PretrainConfig) -> PretrainConfig:
  """The typed config of a pretraining recipe's ConfigDict: the one place
  it is read. Each stage's overrides are set into a copy of the recipe's
  sections first, so an unknown key or a value of the wrong type fails
  naming it, as on the command line.

  Errors name the stage and the key: an unknown key, a stage without steps,
  steps that do not add up to config.train.steps, a key the run shares.
  """
  if isinstance(config, PretrainConfig):
    return config
  typed = sections.build(PretrainConfig, {k: v for k, v in config.items()
                                          if k != "stages"})
  if not config.stages:
    return typed
  stages = []
  for k, stage in enumerate(config.stages):
    where = f"config.stages[{k}]"
    if isinstance(stage, ml_collections.ConfigDict):
      stage = stage.to_dict()
    if not isinstance(stage, Mapping):
      raise ValueError(f"{where}={stage!r}: a stage is a dict of {STAGE_KEYS}")
    unknown = sorted(set(stage) - set(STAGE_KEYS))
    if unknown:
      raise ValueError(f"{where}: unknown key {unknown[0]!r}; a stage has "
                       f"{', '.join(STAGE_KEYS)}")
    steps = stage.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
      raise ValueError(f"{where}.steps={steps!r}: every stage needs a whole "
                       "number of steps, 1 or more")
    for name in RUN_WIDE_DATA_KEYS:
      if name in stage.get("data", {}):
        raise ValueError(f"{where}.data.{name}: one for the whole run "
                         f"(config.data.{name})")
    merged = {}
    for section_name in ("data", "objective"):
      section = copy.deepcopy(config[section_name])
      _override(section, stage.get(section_name, {}), f"{where}.{section_name}",
                f"config.{section_name}")
      merged[section_name] = section
    stages.append(Stage(steps, sections.build(DataConfig, merged["data"], f"{where}.data"),
                        sections.build(ObjectiveConfig, merged["objective"],
                                       f"{where}.objective")))
  total = sum(s.steps for s in stages)
  if total != typed.train.steps:
    raise ValueError(f"config.stages run {' + '.join(str(s.steps) for s in stages)} = "
                     f"{total} steps, but config.train.steps={typed.train.steps}; "
                     "make them agree (the schedule spans config.train.steps)")
  return dataclasses.replace(typed, stages=tuple(stages))


def _override(section: ml_collections.ConfigDict, values: Mapping[str, Any],
              where: str, path: str) -> None:
  """Sets a stage's values into (a copy of) a config section. A declared
  section (locked: data.source, ...) takes them key by key, so an unknown
  key fails naming it and the keys a stage leaves alone stay; anything
  else (a map such as source.files) is replaced whole."""
  for name, value in values.items():
    if name not in section:
      raise ValueError(f"{where}.{name}: {path} has no key {name!r}")
    current = section[name]
    if (isinstance(current, ml_collections.ConfigDict) and current.is_locked
        and isinstance(value, Mapping)):
      _override(current, value, f"{where}.{name}", f"{path}.{name}")
      continue
    try:
      section[name] = value
    except (TypeError, ValueError) as e:
      raise ValueError(f"{where}.{name}={value!r}: {e}") from e
