"""Every config section's keys and types, the skeletons, the ``:key=value`` parser.

This file is the one place where a key is declared: each section comes from
one function here, with its defaults, so a misspelt override
(``--config.optim.lrr=1``) or a wrong type fails loudly, naming the key.
Sections come back locked: recipes change values, they never add keys.
tests/configs_test.py checks that library code reads every key declared here.
"""

from __future__ import annotations

import os
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


def _section(defaults: dict[str, Any], overrides: dict[str, Any]) -> ConfigDict:
  """A locked section: ``overrides`` may change values (type-checked), never
  add keys, so a section's shape is the one its function declares."""
  c = ConfigDict(defaults)
  c.lock()
  for key, value in overrides.items():
    setattr(c, key, value)
  return c


# ----------------------------------------------------------------------------
# Sections both skeletons use.


def _model_keys(model: str) -> dict[str, Any]:
  """The seed and the backbone: a preset of jaxtl.configs.models."""
  return dict(seed=0, model=models.get_model_config(model),
              vocab_multiple=128)  # Pad the embedding to a multiple (shards evenly).


def optim_config(**overrides: Any) -> ConfigDict:
  """AdamW with linear warmup, then decay (jaxtl.train.optim.make_schedule)."""
  return _section(dict(
      lr=1e-3, warmup_steps=100,
      warmup_fraction=0.0,  # used when warmup_steps is 0: a share of all steps
      schedule="cosine",  # cosine | linear | stlr (ULMFiT) | constant
      end_lr_ratio=0.1, weight_decay=0.01, b1=0.9, b2=0.98, eps=1e-8,
      clip_norm=1.0,
      accum_steps=1), overrides)  # micro-batches per update (same batch size)


def mesh_config(**overrides: Any) -> ConfigDict:
  """The device mesh and the logical-axis rules (jaxtl.train.sharding)."""
  return _section(dict(
      shape=(-1, 1, 1),  # (data, fsdp, tensor); -1 takes the rest.
      rules=ConfigDict()), overrides)  # logical axis -> mesh axes.


# ----------------------------------------------------------------------------
# Pretraining.


def objective_config(**overrides: Any) -> ConfigDict:
  """The pretraining objective and its corruption rates."""
  return _section(dict(
      name="clm",  # clm | mlm | span | electra | bart | prefix_lm | prefix_lm_encdec
      mask_rate=0.15, mask_token_rate=0.8, random_token_rate=0.1,  # mlm
      whole_word=False,  # mlm, electra: mask whole words (the tokenizer's)
      # electra: the generator's width/heads/MLP as a fraction of the
      # discriminator's, its depth (0: the same), the detection loss weight.
      generator_scale=0.25, generator_layers=0, rtd_weight=50.0,
      # span; bart: the masked share and the Poisson mean of span lengths
      noise_density=0.15, mean_noise_span_length=3.0,
      permute_sentence_ratio=1.0,  # bart: the share of sentences shuffled
      # Positions whose logits exist at once in the loss (0: all of them).
      loss_chunk_len=objectives.LOSS_CHUNK_LEN), overrides)


def source_config(**overrides: Any) -> ConfigDict:
  """A corpus, read as a stream by jaxtl.data.sources.iter_texts."""
  return _section(dict(
      # tfds | hf | text | jsonl | tsv | parquet | mixture | pretokenized; file kinds
      # map split -> list of paths; a mixture maps part names to such sources.
      # tfds: name; data_dir holds prepared data ("": $TFDS_DATA_DIR, else
      # ~/tensorflow_datasets); manual_dir, source files to prepare from.
      # hf: name is a Hub dataset, a save_to_disk folder, or csv | tsv | json
      # | parquet with files; subset is the Hub config ("qnli"); cache_dir
      # ("": $HF_DATASETS_CACHE, else ~/.cache/huggingface/datasets).
      # field: the text column / feature.
      # pretokenized: data_dir is a folder python -m jaxtl.tools.pretokenize
      # wrote (ArrayRecord shards of token ids and their tokenizer).
      kind="tfds", name="", data_dir="", manual_dir="", field="text",
      subset="", cache_dir="",
      files=ConfigDict(), paragraphs=False, encoding="utf-8",
      # text: a regex; each document becomes its first group (a labeled
      # file's texts without their labels, e.g. TREC's "^\\S+ (.*)$").
      line_pattern="",
      # mixture: parts maps names to sources; mixing is concat (all of every
      # part) | rates (each part's ``rate``: its share of the documents) |
      # proportional (T5: share ∝ min(documents, cap) ** (1 / temperature);
      # cap 0: none). jaxtl.data.mixtures.
      parts=ConfigDict(), mixing="concat", cap=0, temperature=1.0), overrides)


def tokenizer_config(**overrides: Any) -> ConfigDict:
  """A sentencepiece model to load, or to train on the train split."""
  return _section(dict(
      path="",  # a .model file; empty: train one on the train split.
      vocab_size=8000, model_type="unigram", max_sentences=500_000), overrides)


def data_config(**overrides: Any) -> ConfigDict:
  """The host pipeline: corpus, tokenizer, rows and batches."""
  return _section(dict(
      source=source_config(), train_split="train", eval_split="validation",
      tokenizer=tokenizer_config(),
      seq_len=128,  # input length (encoder inputs for span corruption).
      packing="chunk",  # chunk | pack
      batch_size=32,  # global, over all processes.
      max_docs=0,  # 0: all documents of a split.
      cache=True,  # keep the rows in WORKDIR/data_cache (else a temp folder).
      # Grain worker processes that read rows and apply the objective (0:
      # in the training process, in the prefetch thread).
      workers=0,
      prefetch=2), overrides)


def pretrain_train_config(**overrides: Any) -> ConfigDict:
  """How long and how often a pretraining run goes, in steps."""
  return _section(dict(
      steps=1000, log_every=50, eval_every=250, eval_batches=20,
      # Steps between resumable checkpoints; 0: none periodically, only the
      # last step's (the run's result) and one on SIGTERM.
      checkpoint_every=250, keep_checkpoints=3, max_bad_steps=20,
      # FLOP/s per device for MFU; 0: looked up in jaxtl.train.perf.PEAK_FLOPS.
      peak_flops=0.0), overrides)


def pretrain_config(model: str) -> ConfigDict:
  """The pretraining skeleton every pretrain_*.py recipe starts from."""
  return _section(dict(
      **_model_keys(model),
      # Continued pretraining: a jaxtl workdir or Hugging Face folder whose
      # architecture (then config.model only sets dropout), tokenizer and
      # weights, LM head included, the run starts from.
      init_from="",
      objective=objective_config(), data=data_config(),
      optim=optim_config(), train=pretrain_train_config(), mesh=mesh_config(),
      # Stages run in order, one optimizer and schedule over all of them
      # (jaxtl.train.pretrain.stage_configs): each a dict of its ``steps``
      # (adding up to train.steps) and overrides of ``data`` (seq_len,
      # batch_size, source, ...) and ``objective`` keys, e.g. BERT's
      # (dict(steps=900, data=dict(seq_len=128)), dict(steps=100)) with
      # data.seq_len=512. Evaluation uses data and objective as they are.
      # Empty: one stage of train.steps.
      stages=()), {})


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


def task_config(**overrides: Any) -> ConfigDict:
  """The labeled task and its head (jaxtl.tasks.finetune)."""
  return _section(dict(
      name="trec", kind="classification", metrics="trec", max_len=64,
      # first ([CLS]) | last (last non-padding token) | mean | concat
      # (ULMFiT: [last, max, mean], 3 x d_model wide) | pooler
      # ([CLS] + BERT's dense + tanh, loaded from HF BERT checkpoints) | ""
      # (the backbone's default: first for BERT-style encoders, mean otherwise)
      pooling="",
      # Held out of train for model selection when the task has no dev
      # split; 0: train on all of train and report the last epoch.
      dev_fraction=0.1,
      num_train_examples=0,  # 0: all; else a fixed random subset
      max_eval_examples=0,  # 0: all; else a fixed random N of dev and test (quick looks)
      on_error="raise", head_dropout=0.1,
      doc_stride=128, max_answer_tokens=30,  # span_qa only
      # text_to_text (T5 backbones, classification tasks): the text written
      # for each class; empty: the label names.
      label_words=(),
      # generation (T5 / GPT-2 write the output text, jaxtl.tasks.generation):
      # output tokens trained on and written (with EOS), and T5's beam width.
      max_target_len=32, num_beams=1,
      # task=files (jaxtl.tasks.file_task): the user's own labeled files.
      train="", dev="", test="",  # dev/test "": held out of train by a fraction
      test_fraction=0.0,  # with dev_fraction, drawn with config.seed
      # csv | tsv | tsv_unquoted | jsonl | parquet; "": by extension; hf: a
      # Hugging Face dataset (task.hf), train/dev/test then name its splits
      format="",
      hf=dict(name="", subset="", cache_dir=""),  # jaxtl.data.hf_datasets.HFSpec
      text_fields=("text",),  # one field, two for pairs; tagging: the words list
      label_field="label",  # class, score, (tagging) tags, (generation) target text(s)
      labels=()), overrides)  # class order; empty: train's labels, sorted


def adapt_config(**overrides: Any) -> ConfigDict:
  """How the backbone adapts: the scheme and its knobs (ULMFiT, adapters, LoRA)."""
  return _section(dict(
      scheme="full", freeze=(), layer_decay=1.0, unfreeze_epochs=0.0,
      adapter_dim=16, lora_rank=8, lora_alpha=16.0, lora_dropout=0.0,
      lora_targets=("query", "value"), dropout_rate=0.1,
      attention_dropout_rate=0.0), overrides)


def finetune_train_config(**overrides: Any) -> ConfigDict:
  """How long and how often a fine-tuning run goes, in epochs."""
  return _section(dict(
      epochs=3, batch_size=32,
      # Each batch is cut to its longest text rounded up to this many tokens
      # (0: always max_len); a few shapes to compile, far less padding.
      length_multiple=16,
      log_every=50,  # steps between train-loss lines
      # Epochs between resumable checkpoints (fractions save mid-epoch);
      # 0: none periodically, as in pretraining: the run's result is still
      # kept (best/: the selected epoch), the last state is saved at the end
      # (a rerun only evaluates) and SIGTERM or Ctrl-C still saves.
      checkpoint_every=1.0,
      max_bad_steps=20), overrides)  # consecutive non-finite steps that stop the run


def finetune_config(model: str) -> ConfigDict:
  """The fine-tuning skeleton finetune*.py recipes start from."""
  return _section(dict(
      **_model_keys(model),  # model: only used without init_from
      init_from="",  # a pretraining workdir
      tokenizer_path="",  # default: the one in init_from/tokenizer/
      task=task_config(), adapt=adapt_config(),
      optim=optim_config(warmup_steps=50, schedule="linear", end_lr_ratio=0.0,
                         b2=0.999),
      train=finetune_train_config(), mesh=mesh_config()), {})


# ----------------------------------------------------------------------------
# The transfer study (jaxtl.tools.transfer_study).


def study_config(**overrides: Any) -> ConfigDict:
  """The study's grid: backbones x inits x recipes x label budgets x seeds."""
  return _section(dict(
      models=("clm", "mlm"),  # names in the study config's pretrain section
      inits=("pretrained", "random"),
      recipes=("full", "features", "scalar_mix", "adapters", "lora", "ulmfit"),
      num_labels=(100, 500, 1000, 0),  # 0: every training example
      seeds=(0, 1, 2),  # each draws its own labeled subset and initialisation
      min_steps=150, min_epochs=3,
      # Mean pooling for both: the MLM had no sentence objective to train
      # its [CLS], and see heads.default_pooling for the CLM.
      pooling=dict(clm="mean", mlm="mean"),
      # Learning-rate grids, chosen per run on dev (so per init).
      lr=dict(full=(3e-4, 1e-3), ulmfit=(3e-4, 1e-3), features=(3e-3, 1e-2),
              scalar_mix=(3e-3, 1e-2), adapters=(1e-3, 3e-3), lora=(1e-3, 3e-3)),
      metric="accuracy"), overrides)
