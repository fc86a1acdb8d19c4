"""Every config section's keys, their defaults and meanings, the skeletons,
the ``:key=value`` parser, and :func:`describe`.

This file is the one place where a key is declared: each section comes from
one function here that declares each key once, as ``Key(default, meaning)``,
so a misspelt override (``--config.optim.lrr=1``) or a wrong type fails
loudly, naming the key, and ``jaxtl config RECIPE`` says what every key
means. Sections come back locked: recipes change values, they never add
keys. tests/configs_test.py checks that library code reads every key
declared here, tests/config_meanings_test.py that every key of every recipe
has a meaning.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from jaxtl.configs import models
from jaxtl import objectives

ConfigDict = ml_collections.ConfigDict


def parse_arg(arg: str | None, **defaults: Any) -> ConfigDict:
  """``"model=gpt2_tiny,steps=10"`` -> ConfigDict, typed by ``defaults``."""
  values = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in defaults:
      raise ValueError(f"config argument {item!r}: expected key=value with a "
                       f"key in {sorted(defaults)}")
    values[key] = type(defaults[key])(value)
  return ConfigDict(values)


def data_dir_path(*parts: str) -> str:
  """A path under $JAXTL_DATA_DIR, or "" when the variable is unset."""
  root = os.environ.get("JAXTL_DATA_DIR", "")
  return os.path.join(root, *parts) if root else ""


# ----------------------------------------------------------------------------
# The schema: a section declares each key as a Key, a nested Section, or a
# Map of entries the user names.


@dataclasses.dataclass(frozen=True)
class Key:
  """One setting: its default and what it means, a short line for a person
  at the command line ("peak learning rate, reached after warmup")."""
  default: Any
  meaning: str

  def __post_init__(self):
    if not self.meaning.strip():
      raise ValueError(f"Key({self.default!r}): a key needs a meaning")


@dataclasses.dataclass(frozen=True)
class Map:
  """A key whose entries the user names (splits, mixture parts, mesh axes):
  ``entry`` is each entry's meaning (``{name}``: the entry's name), or the
  Section each entry is."""
  default: dict[str, Any]
  entry: str | Section


class Section:
  """A config section, declared by a function that returns its keys.

  Calling the section gives its locked ConfigDict: ``overrides`` change
  values (type-checked; a nested section takes a dict, key by key), never
  add keys. ``keys()`` gives the declarations, which :func:`describe` reads.
  """

  def __init__(self, declare: Callable[[], Keys]):
    self.keys = declare
    functools.update_wrapper(self, declare)

  def __call__(self, **overrides: Any) -> ConfigDict:
    keys = self.keys()
    c = ConfigDict({name: _default(node) for name, node in keys.items()})
    c.lock()
    for name, value in overrides.items():
      if isinstance(keys.get(name), Section) and isinstance(value, (dict, ConfigDict)):
        c[name].update(value)  # replacing it would unlock it
      else:
        setattr(c, name, value)
    return c


Keys = dict[str, Key | Section | Map]


def _default(node: Key | Section | Map) -> Any:
  """A declaration's value in a fresh ConfigDict (a nested section, built)."""
  if isinstance(node, Section):
    return node()
  return dict(node.default) if isinstance(node, Map) else node.default


# ----------------------------------------------------------------------------
# Sections both skeletons use.


@Section
def model_config() -> Keys:
  """The backbone: every TransformerConfig field (jaxtl.models.config says
  what each means); recipes start from a preset of jaxtl.configs.models."""
  return {name: Key(default, meaning)
          for name, (default, meaning) in models.fields().items()}


def _model_keys() -> Keys:
  """The seed and the backbone."""
  return dict(
      seed=Key(0, "random seed: initialisation, data order, sampling"),
      model=model_config,
      vocab_multiple=Key(128, "the embedding's rows are padded to a multiple of "
                              "this (shards evenly)"))


@Section
def optim_config() -> Keys:
  """AdamW with linear warmup, then decay (jaxtl.train.optim.make_schedule)."""
  return dict(
      lr=Key(1e-3, "peak learning rate, reached after warmup"),
      warmup_steps=Key(100, "steps of linear warmup to lr; 0: warmup_fraction decides"),
      warmup_fraction=Key(0.0, "warmup as a share of all steps, when warmup_steps is 0"),
      schedule=Key("cosine", "decay after warmup: cosine | linear | stlr (ULMFiT's "
                             "slanted triangle) | constant"),
      end_lr_ratio=Key(0.1, "the rate at the last step, as a fraction of lr"),
      weight_decay=Key(0.01, "AdamW's decoupled weight decay (matrices and "
                             "embeddings only)"),
      b1=Key(0.9, "Adam's beta1: decay of the gradient's running mean"),
      b2=Key(0.98, "Adam's beta2: decay of the squared gradient's running mean"),
      eps=Key(1e-8, "Adam's epsilon, added to the update's denominator"),
      clip_norm=Key(1.0, "gradients are clipped to this global norm; 0: no clipping"),
      accum_steps=Key(1, "micro-batches each batch is split into (less memory, "
                         "the same update)"))


@Section
def mesh_config() -> Keys:
  """The device mesh and the logical-axis rules (jaxtl.train.sharding)."""
  return dict(
      shape=Key((-1, 1, 1), "device mesh (data, fsdp, tensor); -1 takes the "
                            "remaining devices"),
      rules=Map({}, "mesh axes logical axis {name} is sharded over (overrides "
                    "jaxtl.train.sharding.DEFAULT_RULES)"))


# ----------------------------------------------------------------------------
# Pretraining.


@Section
def objective_config() -> Keys:
  """The pretraining objective and its corruption rates."""
  return dict(
      name=Key("clm", "pretraining objective: " + " | ".join(objectives.REGISTRY)),
      mask_rate=Key(0.15, "mlm, electra: share of tokens chosen for prediction"),
      mask_token_rate=Key(0.8, "mlm: share of the chosen tokens replaced by [MASK]"),
      random_token_rate=Key(0.1, "mlm: share of the chosen tokens replaced by a "
                                 "random token (the rest stay)"),
      whole_word=Key(False, "mlm, electra: mask whole words (the tokenizer's), not "
                            "single pieces"),
      generator_scale=Key(0.25, "electra: the generator's width, heads and MLP as a "
                                "fraction of the discriminator's"),
      generator_layers=Key(0, "electra: the generator's layers; 0: the "
                              "discriminator's"),
      rtd_weight=Key(50.0, "electra: weight of the replaced-token-detection loss"),
      noise_density=Key(0.15, "span, bart: share of tokens masked out"),
      mean_noise_span_length=Key(3.0, "span, bart: mean length of a masked span "
                                      "(bart: the Poisson mean)"),
      permute_sentence_ratio=Key(1.0, "bart: share of sentences shuffled"),
      loss_chunk_len=Key(objectives.LOSS_CHUNK_LEN,
                         "positions whose logits exist at once in the loss (less "
                         "memory); 0: all"))


@Section
def source_config() -> Keys:
  """A corpus, read as a stream by jaxtl.data.sources.iter_texts."""
  return dict(
      kind=Key("tfds", "corpus format: tfds | hf | text | jsonl | tsv | parquet | "
                       "mixture | pretokenized"),
      name=Key("", "tfds: the dataset; hf: a Hub dataset, a save_to_disk folder, "
                   "or csv | tsv | json | parquet for files"),
      # tfds's default: $TFDS_DATA_DIR, else ~/tensorflow_datasets.
      data_dir=Key("", "tfds: the prepared data (\"\": the default); pretokenized: "
                       "jaxtl pretokenize's output"),
      manual_dir=Key("", "tfds: the source files to prepare the dataset from"),
      field=Key("text", "the column or feature holding the text"),
      subset=Key("", "hf: the Hub dataset's configuration (\"qnli\")"),
      cache_dir=Key("", "hf: the datasets cache (\"\": $HF_DATASETS_CACHE or "
                        "its default)"),
      files=Map({}, "the files of split {name} ({data_dir}: $JAXTL_DATA_DIR)"),
      paragraphs=Key(False, "text: each file is one document; False: each "
                            "non-blank line is one"),
      encoding=Key("utf-8", "text: the files' encoding"),
      # TREC's labeled lines without their labels: "^\\S+ (.*)$".
      line_pattern=Key("", "text: a regex; each document becomes its first group "
                           "(\"\": the whole line)"),
      parts=Map({}, mixture_part),
      mixing=Key("concat", "mixture: concat (all of every part) | rates (each part's "
                           "rate) | proportional (T5's; jaxtl.data.mixtures)"),
      cap=Key(0, "mixing=proportional: a part counts at most this many "
                 "documents; 0: no cap"),
      temperature=Key(1.0, "mixing=proportional: share ∝ min(documents, cap) ** "
                           "(1 / temperature)"))


@Section
def mixture_part() -> Keys:
  """One part of a mixture: a source, and its share when mixing=rates."""
  return dict(source_config.keys(),
              rate=Key(1.0, "mixing=rates: this part's share of the documents "
                            "(rates are normalised)"))


@Section
def tokenizer_config() -> Keys:
  """A sentencepiece model to load, or to train on the train split."""
  return dict(
      path=Key("", "a sentencepiece .model file; \"\": train one on the train split"),
      vocab_size=Key(8000, "vocabulary size of a trained tokenizer"),
      model_type=Key("unigram", "algorithm of a trained tokenizer: unigram | bpe"),
      max_sentences=Key(500_000, "most sentences a tokenizer trains on (a seeded "
                                 "sample)"))


@Section
def data_config() -> Keys:
  """The host pipeline: corpus, tokenizer, rows and batches."""
  return dict(
      source=source_config,
      train_split=Key("train", "the source's split to train on"),
      eval_split=Key("validation", "the source's split to evaluate on"),
      tokenizer=tokenizer_config,
      seq_len=Key(128, "tokens per row (span corruption: the encoder's inputs)"),
      packing=Key("chunk", "chunk (documents joined and cut) | pack (documents "
                           "kept apart in rows)"),
      batch_size=Key(32, "rows per batch, over all processes"),
      max_docs=Key(0, "documents read per split; 0: all"),
      cache=Key(True, "keep the rows in WORKDIR/data_cache (else a temporary folder)"),
      workers=Key(0, "Grain processes that read rows and apply the objective; 0: "
                     "the training process's prefetch thread"),
      prefetch=Key(2, "batches prepared ahead of the training step"))


@Section
def pretrain_train_config() -> Keys:
  """How long and how often a pretraining run goes, in steps."""
  return dict(
      steps=Key(1000, "optimizer updates in the whole run"),
      log_every=Key(50, "steps between train-metric lines"),
      eval_every=Key(250, "steps between evaluations"),
      eval_batches=Key(20, "batches per evaluation"),
      checkpoint_every=Key(250, "steps between resumable checkpoints; 0: only the "
                                "last step's and one on SIGTERM"),
      keep_checkpoints=Key(3, "periodic checkpoints kept (older ones are deleted)"),
      max_bad_steps=Key(20, "consecutive non-finite steps that stop the run"),
      peak_flops=Key(0.0, "FLOP/s per device for MFU; 0: looked up in "
                          "jaxtl.train.perf.PEAK_FLOPS"))


@Section
def _pretraining() -> Keys:
  """The pretraining skeleton's keys."""
  return dict(
      **_model_keys(),
      init_from=Key("", "continued pretraining: a jaxtl workdir or Hugging Face "
                        "folder whose weights, tokenizer and architecture the run "
                        "starts from (model then only sets dropout); \"\": none"),
      objective=objective_config, data=data_config, optim=optim_config,
      train=pretrain_train_config, mesh=mesh_config,
      # Each stage a dict of its ``steps`` (adding up to train.steps) and
      # overrides of ``data`` (seq_len, batch_size, source, ...) and
      # ``objective`` keys (jaxtl.pretraining.pretrain.stage_configs), e.g. BERT's
      # (dict(steps=900, data=dict(seq_len=128)), dict(steps=100)) with
      # data.seq_len=512. Evaluation uses data and objective as they are.
      stages=Key((), "stages run in order under one schedule, each dict(steps=N, "
                     "data=..., objective=...); (): one stage"))


def pretrain_config(model: str) -> ConfigDict:
  """The pretraining skeleton every pretrain_*.py recipe starts from, with
  the backbone of preset ``model``."""
  return _pretraining(model=models.get_model_config(model))


def use_wikitext2(c: ConfigDict) -> ConfigDict:
  """Points a pretraining config at local WikiText-2: the recipes train on
  its test.txt (2,891 lines, small enough for a CPU) and evaluate on
  valid.txt, with a 4k unigram sentencepiece trained on it, 128-token rows."""
  wiki = lambda name: "{data_dir}/wikitext2/" + name
  c.data.source.update(kind="text")
  c.data.source.files = dict(train=[wiki("test.txt")], validation=[wiki("valid.txt")])
  c.data.tokenizer.update(vocab_size=4000, model_type="unigram")
  c.data.seq_len = 128
  return c


# ----------------------------------------------------------------------------
# Fine-tuning.


@Section
def hf_spec() -> Keys:
  """A Hugging Face dataset a task=files task reads (format=hf;
  jaxtl.data.hf_datasets.HFSpec)."""
  return dict(
      name=Key("", "format=hf: a Hub dataset, or a save_to_disk folder"),
      subset=Key("", "format=hf: the Hub dataset's configuration (\"qnli\")"),
      cache_dir=Key("", "format=hf: the datasets cache (\"\": $HF_DATASETS_CACHE "
                        "or its default)"))


@Section
def task_config() -> Keys:
  """The labeled task and its head (jaxtl.tasks.finetune)."""
  return dict(
      name=Key("trec", "the task: trec | sst2 | cola | mrpc | rte | stsb | imdb | "
                       "pos | squad | files (your own)"),
      kind=Key("classification", "the head: classification | regression | "
                                 "token_classification | span_qa | text_to_text | "
                                 "generation"),
      metrics=Key("trec", "metrics reported: a task's set, or a comma list; \"\": "
                          "the kind's"),
      max_len=Key(64, "tokens per example; longer ones are cut (span_qa: windows)"),
      # concat is ULMFiT's [last, max, mean], 3 x d_model wide; pooler is
      # [CLS] + BERT's dense + tanh, loaded from HF BERT checkpoints.
      pooling=Key("", "what the head reads: first | last | mean | concat | pooler; "
                      "\"\": the backbone's default"),
      dev_fraction=Key(0.1, "share of train held out as dev when the task has none; "
                            "0: train on all, report the last epoch"),
      num_train_examples=Key(0, "train on a fixed random subset this big; 0: all"),
      max_eval_examples=Key(0, "score a fixed random N of dev and test (quick "
                               "looks); 0: all"),
      on_error=Key("raise", "a malformed row in the task's files: raise | skip"),
      head_dropout=Key(0.1, "dropout before the task head"),
      doc_stride=Key(128, "span_qa: tokens between the starts of a long "
                          "context's windows"),
      max_answer_tokens=Key(30, "span_qa: longest answer predicted, in tokens"),
      label_words=Key((), "text_to_text: the text written for each class; (): "
                          "the label names"),
      max_target_len=Key(32, "generation: output tokens trained on and written "
                             "(with EOS)"),
      num_beams=Key(1, "generation: T5's beam width; 1: greedy"),
      train=Key("", "task=files: the training file (format=hf: the split)"),
      dev=Key("", "task=files: the dev file; \"\": held out of train by "
                  "dev_fraction"),
      test=Key("", "task=files: the test file; \"\": held out of train by "
                   "test_fraction"),
      test_fraction=Key(0.0, "task=files without a test file: share of train held "
                             "out as test (drawn with seed)"),
      format=Key("", "task=files: csv | tsv | tsv_unquoted | jsonl | parquet | hf "
                     "(task.hf); \"\": by extension"),
      hf=hf_spec,
      text_fields=Key(("text",), "the input fields: one, two for pairs; tagging: "
                                 "the words list"),
      label_field=Key("label", "the target field: class, score, tags (tagging) or "
                               "text(s) (generation)"),
      labels=Key((), "class order; (): train's labels, sorted"))


@Section
def adapt_config() -> Keys:
  """How the backbone adapts: the scheme and its knobs (ULMFiT, adapters, LoRA)."""
  return dict(
      scheme=Key("full", "what trains: full | features (frozen backbone, linear "
                         "probe) | scalar_mix | adapters | lora"),
      freeze=Key((), "regexes of more parameters to freeze (\"^backbone/...\")"),
      layer_decay=Key(1.0, "each layer trains at this times the rate of the one "
                           "above (ULMFiT); 1: one rate"),
      unfreeze_epochs=Key(0.0, "gradual unfreezing, top first: one more layer "
                               "every this many epochs; 0: off"),
      adapter_dim=Key(16, "scheme=adapters: each adapter's bottleneck width"),
      lora_rank=Key(8, "scheme=lora: rank of the LoRA updates"),
      lora_alpha=Key(16.0, "scheme=lora: updates are multiplied by alpha / rank"),
      lora_dropout=Key(0.0, "scheme=lora: dropout on LoRA's input"),
      lora_targets=Key(("query", "value"), "scheme=lora: projections adapted, of "
                                           "query, key, value, out"),
      dropout_rate=Key(0.1, "the backbone's dropout while fine-tuning"),
      attention_dropout_rate=Key(0.0, "the backbone's attention dropout while "
                                      "fine-tuning"))


@Section
def finetune_train_config() -> Keys:
  """How long and how often a fine-tuning run goes, in epochs."""
  return dict(
      epochs=Key(3, "passes over the training set"),
      batch_size=Key(32, "examples per batch, over all processes"),
      # A few shapes to compile, far less padding.
      length_multiple=Key(16, "a batch is cut to its longest text, rounded up to "
                              "this; 0: always max_len"),
      log_every=Key(50, "steps between train-loss lines"),
      # The run's result is kept anyway (best/: the selected epoch), the last
      # state is saved at the end (a rerun only evaluates) and SIGTERM or
      # Ctrl-C still saves.
      checkpoint_every=Key(1.0, "epochs between resumable checkpoints (fractions "
                                "save mid-epoch); 0: none periodically"),
      max_bad_steps=Key(20, "consecutive non-finite steps that stop the run"))


@Section
def _finetuning() -> Keys:
  """The fine-tuning skeleton's keys."""
  return dict(
      **_model_keys(),
      init_from=Key("", "the pretrained model: a jaxtl workdir or Hugging Face "
                        "folder; \"\": a random init of model"),
      tokenizer_path=Key("", "the tokenizer of a random init; \"\": init_from's"),
      task=task_config, adapt=adapt_config, optim=optim_config,
      train=finetune_train_config, mesh=mesh_config)


def finetune_config(model: str) -> ConfigDict:
  """The fine-tuning skeleton finetune*.py recipes start from; ``model``
  (a preset) is only used without init_from."""
  return _finetuning(model=models.get_model_config(model),
                     optim=dict(warmup_steps=50, schedule="linear", end_lr_ratio=0.0,
                                b2=0.999))


# ----------------------------------------------------------------------------
# The transfer study (jaxtl.tools.transfer_study).


@Section
def study_config() -> Keys:
  """The study's grid: backbones x inits x recipes x label budgets x seeds."""
  return dict(
      models=Key(("clm", "mlm"), "backbones: names in the config's pretrain section"),
      inits=Key(("pretrained", "random"), "initialisations compared: pretrained | "
                                          "random"),
      recipes=Key(("full", "features", "scalar_mix", "adapters", "lora", "ulmfit"),
                  "adaptation recipes compared"),
      num_labels=Key((100, 500, 1000, 0), "labeled-example budgets; 0: every "
                                          "training example"),
      seeds=Key((0, 1, 2), "seeds; each draws its own labeled subset and "
                           "initialisation"),
      min_steps=Key(150, "fewest updates per run (small budgets get more epochs)"),
      min_epochs=Key(3, "fewest epochs per run"),
      # Mean for both: the MLM had no sentence objective to train its [CLS],
      # and see heads.default_pooling for the CLM.
      pooling=Map(dict(clm="mean", mlm="mean"), "the head's pooling on backbone "
                                                "{name}"),
      # Chosen per run on dev (so per init).
      lr=Map(dict(full=(3e-4, 1e-3), ulmfit=(3e-4, 1e-3), features=(3e-3, 1e-2),
                  scalar_mix=(3e-3, 1e-2), adapters=(1e-3, 3e-3),
                  lora=(1e-3, 3e-3)),
             "learning rates tried with recipe {name}, the best on dev kept"),
      metric=Key("accuracy", "the test metric transfer.md and transfer.png report"))


@Section
def _transfer_study() -> Keys:
  """configs/transfer_study.py's keys: a pretraining config per backbone,
  the fine-tuning config every cell starts from, the grid."""
  return dict(pretrain=Map({}, _pretraining), finetune=_finetuning, study=study_config)


# ----------------------------------------------------------------------------
# What each key of a config means.


class UndocumentedKey(ValueError):
  """Config keys that no section declares, so nothing can tell a user what
  they mean; ``keys`` lists them all, not only the first."""

  def __init__(self, keys: Sequence[str]):
    self.keys = list(keys)
    super().__init__(f"no meaning is declared for {', '.join(self.keys)}: declare "
                     "each as Key(default, meaning) in jaxtl.configs.common")


def skeleton(config: Any) -> Section | None:
  """The skeleton a config was built from, by its sections: a fine-tuning
  config has a task, a pretraining config an objective, the transfer study
  a study grid. (Both skeletons have train.checkpoint_every, in epochs for
  one and steps for the other.)"""
  for section, root in (("task", _finetuning), ("objective", _pretraining),
                        ("study", _transfer_study)):
    if section in config:
      return root
  return None  # not a jaxtl skeleton: no key is declared


def _below(node: Key | Section | Map | None, name: str) -> Key | Section | Map | None:
  """The declaration of key ``name`` inside ``node``."""
  if isinstance(node, Section):
    return node.keys().get(name)
  if isinstance(node, Map):
    entry = node.entry
    return Key(None, entry.replace("{name}", name)) if isinstance(entry, str) else entry
  return None  # a leaf has nothing below it


def meaning(root: Section | None, key: str) -> str:
  """What dotted ``key`` means in configs of ``root``; "" when undeclared."""
  node = root
  for name in key.split("."):
    node = _below(node, name)
  return node.meaning if isinstance(node, Key) else ""


def describe(config: Any, *, strict: bool = True) -> list[tuple[str, Any, str]]:
  """(dotted key, value, meaning) for every leaf of a resolved recipe
  config, in jaxtl.train.identity.leaves order.

  Raises UndocumentedKey naming every leaf without a meaning; with
  ``strict=False`` its meaning is "" instead (a user's own config file may
  carry keys of its own).
  """
  from jaxtl.train.identity import leaves  # pylint: disable=g-import-not-at-top
  root = skeleton(config)
  rows = [(key, value, meaning(root, key)) for key, value in leaves(config)]
  missing = [key for key, _, text in rows if not text]
  if missing and strict:
    raise UndocumentedKey(missing)
  return rows
