"""The layout of a workdir: the one place its file and folder names are written.

A workdir (``--workdir``) is one training run's folder: what it keeps to
resume, what makes it a loadable model, and what it reports. Every module
that reads or writes one takes its paths from the functions here, so a
name is spelled once and ``tests/layout_test.py`` checks that no other
module spells it. The names are a format: workdirs trained before must
still load, so an entry may be added, never renamed. A workdir, in about
the order a run writes it::

  .lock               the owner: an exclusive flock, with "pid P on HOST since
                      T" inside (jaxtl.train.workdir.owned, process 0), taken
                      before anything else is written; removed only when a
                      failed start leaves nothing else.
  identity.json       the settings the checkpoints are bound to and the last
                      accepted start's settings (jaxtl.train.identity.record,
                      process 0), once the run's own checks passed.
  config.txt          every start's full config under a header with the time
                      and the command, appended (jaxtl.training.write_config,
                      process 0, right after identity.json).
  tokenizer/          the tokenizer the run trained, or a copy of the one it
                      was given, so the model travels with it (process 0,
                      before training: jaxtl.pretraining.pipeline's build_tokenizer
                      and keep_tokenizer, from DataSetup when pretraining and
                      jaxtl.tasks.finetune.keep_loadable when fine-tuning).
                      A trained SentencePiece model is cached here too.
  model_config.json   the architecture (TransformerConfig's fields; ELECTRA's
                      generator under "generator"): what makes the workdir
                      loadable (jaxtl.pretraining.pretrained.save_model_config,
                      process 0, before training).
  task.json           fine-tuning only: the task and head of the model
                      (jaxtl.tasks.spec.save, before training); its presence
                      is what makes a workdir a fine-tuning one.
  data_cache/         pretraining's tokenized rows of each split, kept across
                      restarts when config.data.cache (DataSetup of
                      jaxtl.pretraining.pipeline; the files are jaxtl.data.row_store's).
  checkpoints/        the full train state every checkpoint_every steps, at
                      the end and on a stop, last K kept
                      (jaxtl.train.loop via jaxtl.train.checkpoint): N/state,
                      N/extra (Orbax's items); N.corrupt (set aside) and
                      N.orbax-checkpoint-tmp (unfinished) are never steps.
  best/               fine-tuning only: the one state the dev score chose (the
                      last epoch without a dev split), same format
                      (jaxtl.train.loop, at each evaluation that improves).
                      The model of a workdir that has one
                      (jaxtl.train.checkpoint.selected_checkpoint).
  metrics.jsonl       one JSON object per step and split, during the run
                      (jaxtl.train.metrics.MetricsWriter, process 0).
  tensorboard/        the same metrics as TensorBoard event files (idem).
  results.json        fine-tuning only: the final scores and history
                      (jaxtl.tasks.finetune, at the end of the run).

It imports nothing of jaxtl, so any layer (data, models, train, tasks,
tools) may use it.
"""

from __future__ import annotations

import os

LOCK_FILE = ".lock"
IDENTITY_FILE = "identity.json"
CONFIG_FILE = "config.txt"
TOKENIZER_DIR = "tokenizer"
MODEL_CONFIG_FILE = "model_config.json"
TASK_FILE = "task.json"
DATA_CACHE_DIR = "data_cache"
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
RESULTS_FILE = "results.json"

# Every entry of a workdir, in the order of the docstring's table.
ENTRIES = (LOCK_FILE, IDENTITY_FILE, CONFIG_FILE, TOKENIZER_DIR, MODEL_CONFIG_FILE,
           TASK_FILE, DATA_CACHE_DIR, CHECKPOINTS_DIR, BEST_DIR, METRICS_FILE,
           TENSORBOARD_DIR, RESULTS_FILE)


def lock_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/.lock``: the flock that makes one run the workdir's owner."""
  return os.path.join(workdir, LOCK_FILE)


def identity_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/identity.json``: what the checkpoints are bound to."""
  return os.path.join(workdir, IDENTITY_FILE)


def config_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/config.txt``: each start's config, appended."""
  return os.path.join(workdir, CONFIG_FILE)


def tokenizer_dir(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/tokenizer``: the run's tokenizer, which travels with the model."""
  return os.path.join(workdir, TOKENIZER_DIR)


def model_config_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/model_config.json``: the architecture, which makes it loadable."""
  return os.path.join(workdir, MODEL_CONFIG_FILE)


def task_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/task.json``: a fine-tuned model's task (fine-tuning only)."""
  return os.path.join(workdir, TASK_FILE)


def data_cache(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/data_cache``: pretraining's tokenized rows, kept for a restart."""
  return os.path.join(workdir, DATA_CACHE_DIR)


def checkpoints(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/checkpoints``: the periodic states a run resumes from."""
  return os.path.join(workdir, CHECKPOINTS_DIR)


def best(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/best``: the state the dev score selected (the model, when present)."""
  return os.path.join(workdir, BEST_DIR)


def metrics_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/metrics.jsonl``: one JSON object per step and split."""
  return os.path.join(workdir, METRICS_FILE)


def tensorboard_dir(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/tensorboard``: the metrics as TensorBoard event files."""
  return os.path.join(workdir, TENSORBOARD_DIR)


def results_file(workdir: str | os.PathLike[str]) -> str:
  """``WORKDIR/results.json``: a finished fine-tuning run's scores."""
  return os.path.join(workdir, RESULTS_FILE)
