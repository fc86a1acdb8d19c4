"""A fine-tuning run's typed config: the sections a recipe's ConfigDict is
turned into once (:func:`of`), before the run starts.

Each key is declared here, with its default and its one-line meaning
(:func:`jaxtl.sections.key`); the fine-tuning skeleton of the recipes
(``jaxtl.configs.common``) derives its ConfigDict sections from these
classes, and library code takes them instead of a ConfigDict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from jaxtl import sections
from jaxtl.pretraining import config as pretrain_config
from jaxtl.pretraining.config import MODEL, PretrainConfig
from jaxtl.sections import key, section
from jaxtl.train.optim import OptimConfig
from jaxtl.train.sharding import MeshConfig


@dataclasses.dataclass(frozen=True)
class HFDatasetConfig:
  """A Hugging Face dataset a task=files task reads (format=hf).

  Its fields are those of :class:`jaxtl.data.hf_datasets.HFSpec` a task
  names; ``dataclasses.asdict`` of it is a spec ``hf_datasets`` reads.
  """
  name: str = key("", "format=hf: a Hub dataset, or a save_to_disk folder")
  subset: str = key("", "format=hf: the Hub dataset's configuration (\"qnli\")")
  cache_dir: str = key("", "format=hf: the datasets cache (\"\": $HF_DATASETS_CACHE "
                           "or its default)")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """The labeled task and its head (jaxtl.tasks.finetune)."""
  name: str = key("trec", "the task: trec | sst2 | cola | mrpc | rte | stsb | imdb | "
                          "pos | squad | files (your own)")
  kind: str = key("classification", "the head: classification | regression | "
                                    "token_classification | span_qa | text_to_text | "
                                    "generation")
  metrics: str = key("trec", "metrics reported: a task's set, or a comma list; \"\": "
                             "the kind's")
  max_len: int = key(64, "tokens per example; longer ones are cut (span_qa: windows)")
  # concat is ULMFiT's [last, max, mean], 3 x d_model wide; pooler is
  # [CLS] + BERT's dense + tanh, loaded from HF BERT checkpoints.
  pooling: str = key("", "what the head reads: first | last | mean | concat | pooler; "
                         "\"\": the backbone's default")
  dev_fraction: float = key(0.1, "share of train held out as dev when the task has "
                                 "none; 0: train on all, report the last epoch")
  num_train_examples: int = key(0, "train on a fixed random subset this big; 0: all")
  max_eval_examples: int = key(0, "score a fixed random N of dev and test (quick "
                                  "looks); 0: all")
  on_error: str = key("raise", "a malformed row in the task's files: raise | skip")
  head_dropout: float = key(0.1, "dropout before the task head")
  doc_stride: int = key(128, "span_qa: tokens between the starts of a long "
                             "context's windows")
  max_answer_tokens: int = key(30, "span_qa: longest answer predicted, in tokens")
  label_words: tuple[str, ...] = key((), "text_to_text: the text written for each "
                                         "class; (): the label names")
  max_target_len: int = key(32, "generation: output tokens trained on and written "
                                "(with EOS)")
  num_beams: int = key(1, "generation: T5's beam width; 1: greedy")
  train: str = key("", "task=files: the training file (format=hf: the split)")
  dev: str = key("", "task=files: the dev file; \"\": held out of train by "
                     "dev_fraction")
  test: str = key("", "task=files: the test file; \"\": held out of train by "
                      "test_fraction")
  test_fraction: float = key(0.0, "task=files without a test file: share of train "
                                  "held out as test (drawn with seed)")
  format: str = key("", "task=files: csv | tsv | tsv_unquoted | jsonl | parquet | hf "
                        "(task.hf); \"\": by extension")
  hf: HFDatasetConfig = section(HFDatasetConfig)
  text_fields: tuple[str, ...] = key(("text",), "the input fields (a,b): one, two for "
                                                "pairs; tagging: the words list")
  label_field: str = key("label", "the target field: class, score, tags (tagging) or "
                                  "text(s) (generation)")
  labels: tuple[str | int, ...] = key((), "class order (low,mid,high); (): train's "
                                          "labels, sorted")
  label_names: tuple[str, ...] = key((), "what predictions and the export call the "
                                         "classes of labels, in its order "
                                         "(negative,positive for 0,1); (): the labels")

  def __post_init__(self):
    # --config.task.text_fields=premise,hypothesis names two, as predict's
    # --text_fields does (a tuple override takes one value a flag).
    object.__setattr__(self, "text_fields", tuple(
        name.strip() for entry in self.text_fields for name in entry.split(",")))
    # --config.task.labels=low,mid,high arrives as ('low,mid,high',) (1,2,3
    # already parses as three integers); label_names alike. Only a lone
    # entry is split, so "('a, b', 'c')" still names a label with a comma.
    for name in ("labels", "label_names"):
      values = getattr(self, name)
      if len(values) == 1 and isinstance(values[0], str):
        object.__setattr__(self, name, tuple(v.strip() for v in values[0].split(",")))
    if self.label_names and len(self.label_names) != len(self.labels):
      raise ValueError(
          f"config.task.label_names={self.label_names!r} names {len(self.label_names)} "
          f"classes and config.task.labels={self.labels!r} has {len(self.labels)}: give "
          "both in one order (--config.task.labels=0,1 "
          "--config.task.label_names=negative,positive)")
    self._check_files_named_for_files()

  def _check_files_named_for_files(self) -> None:
    """A file named for a built-in task would be ignored for the task's own
    data (and the run would ask for JAXTL_DATA_DIR): say so instead."""
    if self.name == FILES_TASK:
      return
    fields = sections.fields(type(self))
    for name in FILES_ONLY:
      value = getattr(self, name)
      if value != _default(fields[name]):
        raise ValueError(
            f"config.task.{name}={value!r} is read by the files task only, and "
            f"this run's task is {self.name}: add task=files to the recipe, e.g. "
            f"--config=finetune_minilm:task=files")


FILES_TASK = "files"  # config.task.name of a task read from the user's files
# TaskConfig keys only the files task reads.
FILES_ONLY = ("train", "dev", "test", "test_fraction", "format", "hf", "label_names")


def _default(field: dataclasses.Field) -> Any:
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


class TaskSettings(Protocol):
  """What a task kind (:mod:`jaxtl.tasks.kinds`) reads of a task: the run's
  :class:`TaskConfig` while fine-tuning, or, when a fine-tuned workdir
  predicts, the ``TaskSpec`` it keeps (:mod:`jaxtl.tasks.spec`), whose
  fields of these names mean the same."""
  name: str
  kind: str
  metrics: str
  max_len: int
  doc_stride: int
  max_answer_tokens: int
  max_target_len: int
  num_beams: int
  text_fields: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class AdaptConfig:
  """How the backbone adapts: the scheme and its knobs (ULMFiT, adapters, LoRA)."""
  scheme: str = key("full", "what trains: full | features (frozen backbone, linear "
                            "probe) | scalar_mix | adapters | lora")
  freeze: tuple[str, ...] = key((), "regexes of more parameters to freeze "
                                    "(\"^backbone/...\")")
  layer_decay: float = key(1.0, "each layer trains at this times the rate of the one "
                                "above (ULMFiT); 1: one rate")
  unfreeze_epochs: float = key(0.0, "gradual unfreezing, top first: one more layer "
                                    "every this many epochs; 0: off")
  adapter_dim: int = key(16, "scheme=adapters: each adapter's bottleneck width")
  lora_rank: int = key(8, "scheme=lora: rank of the LoRA updates")
  lora_alpha: float = key(16.0, "scheme=lora: updates are multiplied by alpha / rank")
  lora_dropout: float = key(0.0, "scheme=lora: dropout on LoRA's input")
  lora_targets: tuple[str, ...] = key(("query", "value"), "scheme=lora: projections "
                                                          "adapted, of query, key, "
                                                          "value, out")
  dropout_rate: float = key(0.1, "the backbone's dropout while fine-tuning")
  attention_dropout_rate: float = key(0.0, "the backbone's attention dropout while "
                                           "fine-tuning")


# train.compute_dtype's values ("": the backbone's own).
COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "")


@dataclasses.dataclass(frozen=True)
class FinetuneTrainConfig:
  """How long and how often a fine-tuning run goes, in epochs."""
  epochs: int = key(3, "passes over the training set")
  batch_size: int = key(32, "examples per batch, over all processes")
  # A few shapes to compile, far less padding.
  length_multiple: int = key(16, "a batch is cut to its longest text, rounded up to "
                                 "this; 0: always max_len")
  # A batch's examples laid end to end, attention kept within each
  # (jaxtl.tasks.packing): the same function on fewer positions and shapes.
  pack: bool = key(True, "classification and regression: a batch's examples share "
                         "rows (attention stays within each), so a step computes on "
                         "little padding and a run compiles one shape where its "
                         "texts allow (not with optim.accum_steps > 1); False: one "
                         "example per row")
  # Batches of near-equal lengths carry little padding once cut.
  group_by_length: bool = key(True, "batches of kinds that do not pack (or with "
                                    "pack=False) are drawn from texts of similar "
                                    "length (within random chunks of 50 batches); "
                                    "False: plain shuffling")
  # Parameters and optimizer state stay float32 either way; norms and
  # softmax statistics compute in float32 (jaxtl.models.layers).
  # auto: bfloat16 on GPUs and TPUs; on CPUs bfloat16 (with row_major_dots)
  # only where measured to gain from it (jaxtl.runtime.xla_cpu.BF16_RULES),
  # float32 on the others.
  compute_dtype: str = key("auto", "what matmuls and activations compute in: float32 | "
                                   "bfloat16 | auto (bfloat16 on GPUs and TPUs and on "
                                   "CPUs whose bf16 matmuls are twice float32's, "
                                   "float32 on other CPUs); \"\": the backbone's "
                                   "(init_from's, or config.model's)")
  # An XLA:CPU kernel choice; the same function either way.
  row_major_dots: bool = key(False, "dense layers' matmuls as row-major dots with float32 "
                                    "accumulation, backward included "
                                    "(jaxtl.models.dense_dots); bfloat16, auto or asked "
                                    "for, sets it on CPUs where it pays, float32 on "
                                    "an AMX Xeon and a Zen 3 EPYC")
  log_every: int = key(50, "steps between train-loss lines")
  # The run's result is kept anyway (best/: the selected epoch), the last
  # state is saved at the end (a rerun only evaluates) and SIGTERM or
  # Ctrl-C still saves.
  checkpoint_every: float = key(1.0, "epochs between resumable checkpoints (fractions "
                                     "save mid-epoch); 0: none periodically")
  max_bad_steps: int = key(20, "consecutive non-finite steps that stop the run")


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """A fine-tuning run: the backbone, the task and its head, the scheme, the
  schedule. The recipes' skeleton sets optim's warmup_steps=50,
  schedule=linear, end_lr_ratio=0 and b2=0.999 over OptimConfig's
  defaults."""
  seed: int = key(0, "random seed: initialisation, data order, sampling")
  # A TransformerConfig's fields, vocab_size 0 for the tokenizer's: only a
  # random start (no init_from) is built from them, once the tokenizer is
  # known (jaxtl.pretraining.pretrain.model_config_from).
  model: dict[str, Any] = key({}, MODEL)
  vocab_multiple: int = key(128, "the embedding's rows are padded to a multiple of "
                                 "this (shards evenly)")
  init_from: str = key("", "the pretrained model: a jaxtl workdir or Hugging Face "
                           "folder; \"\": a random init of model")
  tokenizer_path: str = key("", "the tokenizer of a random init; \"\": init_from's")
  task: TaskConfig = section(TaskConfig)
  adapt: AdaptConfig = section(AdaptConfig)
  optim: OptimConfig = section(OptimConfig)
  train: FinetuneTrainConfig = section(FinetuneTrainConfig)
  mesh: MeshConfig = section(MeshConfig)


def of(config: FinetuneConfig | Mapping[str, Any]) -> FinetuneConfig:
  """The typed config of a fine-tuning recipe's ConfigDict (or of a mapping
  of its sections: keys left out take their defaults): the one place it is
  read. A FinetuneConfig is returned as it is."""
  if isinstance(config, FinetuneConfig):
    return config
  return sections.build(FinetuneConfig, config)


# ----------------------------------------------------------------------------
# The transfer study (jaxtl.tools.transfer_study): pretraining runs, then
# every way of fine-tuning each.


@dataclasses.dataclass(frozen=True)
class StudyConfig:
  """The transfer study's grid (jaxtl.tools.transfer_study): backbones x
  inits x recipes x label budgets x seeds."""
  models: tuple[str, ...] = key(
      ("clm", "mlm"), "backbones: names in the config's pretrain section")
  inits: tuple[str, ...] = key(
      ("pretrained", "random"), "initialisations compared: pretrained | random")
  recipes: tuple[str, ...] = key(
      ("full", "features", "scalar_mix", "adapters", "lora", "ulmfit"),
      "adaptation recipes compared")
  num_labels: tuple[int, ...] = key(
      (100, 500, 1000, 0), "labeled-example budgets; 0: every training example")
  seeds: tuple[int, ...] = key(
      (0, 1, 2), "seeds; each draws its own labeled subset and initialisation")
  min_steps: int = key(150, "fewest updates per run (small budgets get more "
                                     "epochs)")
  min_epochs: int = key(3, "fewest epochs per run")
  # Mean for both: the MLM had no sentence objective to train its [CLS],
  # and see heads.default_pooling for the CLM.
  pooling: dict[str, str] = key(
      dict(clm="mean", mlm="mean"), "the head's pooling on backbone {name}")
  # Chosen per run on dev (so per init).
  lr: dict[str, float | tuple[float, ...]] = key(
      dict(full=(3e-4, 1e-3), ulmfit=(3e-4, 1e-3), features=(3e-3, 1e-2),
           scalar_mix=(3e-3, 1e-2), adapters=(1e-3, 3e-3), lora=(1e-3, 3e-3)),
      "learning rates tried with recipe {name}, the best on dev kept")
  metric: str = key("accuracy", "the test metric transfer.md and transfer.png "
                                         "report")


@dataclasses.dataclass(frozen=True)
class TransferStudyConfig:
  """configs/transfer_study.py's keys: a pretraining config per backbone,
  the fine-tuning config every cell starts from, the grid."""
  pretrain: dict[str, PretrainConfig] = key(
      {}, "the pretraining run of backbone {name} (a pretrain_*.py config)")
  finetune: FinetuneConfig = section(
      FinetuneConfig, "the fine-tuning config every cell of the grid starts from")
  study: StudyConfig = section(StudyConfig)

  @classmethod
  def from_section(cls, values: Mapping[str, Any], where: str = "config"
                   ) -> TransferStudyConfig:
    """Typed from the recipe's ConfigDict: each backbone's pretraining config
    as a pretraining run types it (its stages included,
    :func:`jaxtl.pretraining.config.of`), the fine-tuning config as
    fine-tuning does (:func:`jaxtl.tasks.config.of`)."""
    return cls(pretrain={name: pretrain_config.of(pre)
                         for name, pre in values["pretrain"].items()},
               finetune=of(values["finetune"]),
               study=sections.build(StudyConfig, values["study"], f"{where}.study"))
