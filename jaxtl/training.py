"""Training runs started from Python as ``jaxtl pretrain | finetune | study``
start them, for a notebook or a script:

  import jaxtl
  config = jaxtl.recipes.load("finetune_minilm:task=trec")
  config.train.epochs = 1
  results = jaxtl.finetune(config, "runs/trec")
  model = jaxtl.load("runs/trec")

The same guards as the commands: the config's values checked before
anything is written, a workdir holding another run's checkpoints refused,
one run per workdir at a time (a lock), and each start's config appended to
``WORKDIR/config.txt``. Rerunning on the same workdir resumes. A mistake
raises (the commands turn the same errors into one line and an exit code);
Ctrl-C during a run saves a checkpoint and raises
:class:`jaxtl.train.stopping.Preempted`.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from jaxtl import layout, recipes
from jaxtl.pretraining import config as pretrain_config
from jaxtl.pretraining import pretrain
from jaxtl.tasks import config as tasks_config
from jaxtl.tasks import finetune as finetune_lib
from jaxtl.tools import transfer_study
from jaxtl.train import config_checks, identity, workdir as workdir_lib

MODES = ("pretrain", "finetune", "study")
# Each mode's recipe as its typed config (jaxtl.sections), and the settings
# it binds a workdir's checkpoints to.
TYPED = {"pretrain": pretrain_config.of, "finetune": tasks_config.of,
         "study": transfer_study.of}
IDENTITY = {"pretrain": pretrain.identity, "finetune": finetune_lib.identity,
            "study": lambda _: {}}


def run(mode: str, config: ml_collections.ConfigDict | str, workdir: str, *,
        command: str = "", verbose: bool = False) -> dict[str, Any]:
  """Runs ``mode`` (pretrain, finetune or study) of ``config`` (a
  ConfigDict, or a recipe as ``--config`` takes it) in ``workdir``.

  Returns the final evaluation (pretrain), the results written to
  ``results.json`` (finetune), or ``{"cells": [...]}`` (study).
  ``command`` heads this start's entry in ``config.txt`` (default: the
  Python call); ``verbose`` logs the whole config.
  """
  if mode not in MODES:
    raise ValueError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
  if isinstance(config, str):
    config = recipes.load(config)
  # Before anything touches the workdir: a bad value, or a run that is not
  # the one the workdir's checkpoints belong to, leaves no trace.
  config_checks.check_values(config, mode)
  typed = TYPED[mode](config)
  ident = {"mode": mode, **IDENTITY[mode](typed)}
  identity.check(workdir, ident)

  def on_start() -> None:  # the run's own checks passed: record it
    if jax.process_index() == 0:
      identity.record(workdir, ident, identity.flatten(config))
      path = write_config(config, workdir, command or f"jaxtl.{mode}(config, {workdir!r})")
      logging.info("config written to %s", path)
    if verbose:
      logging.info("config:\n%s", config)

  # Held from before config.txt is written: a second run on this workdir
  # leaves no trace in it.
  with workdir_lib.owned(workdir, enabled=jax.process_index() == 0):
    return _run_mode(mode, typed, workdir, on_start)


def _run_mode(mode: str, typed: Any, workdir: str, on_start: Callable[[], None]
              ) -> dict[str, Any]:
  if mode == "study":
    on_start()
    return {"cells": transfer_study.run_study(typed, workdir)}
  if mode == "finetune":
    return finetune_lib.finetune_and_evaluate(typed, workdir, on_start)
  return pretrain.train_and_evaluate(typed, workdir, on_start)


def write_config(config: ml_collections.ConfigDict, workdir: str, command: str) -> str:
  """Appends ``config`` to ``workdir/config.txt`` under a header with the
  time and ``command``; returns the file's path.

  Appended, not overwritten: a resumed run may be started with other
  overrides (more steps, another learning rate), and each start's entry
  records what the steps after it ran with.
  """
  os.makedirs(workdir, exist_ok=True)
  path = layout.config_file(workdir)
  stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
  with open(path, "a") as f:
    f.write(f"# {stamp}  {command}\n{str(config).rstrip()}\n\n")
  return path
