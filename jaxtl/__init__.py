"""jaxtl: transfer learning for NLP in JAX/Flax.

From Python, as from the command line:

  import jaxtl
  config = jaxtl.recipes.load("finetune_minilm:task=trec")  # jaxtl recipes lists them
  config.train.epochs = 1
  jaxtl.finetune(config, "runs/trec")
  jaxtl.load("runs/trec").predict(["Who wrote Hamlet?"])

``import jaxtl`` stays light (no JAX, no Flax): the functions import what
they run when called.
"""

from __future__ import annotations

from typing import Any

from jaxtl import recipes

__version__ = "0.1.0"
__all__ = ["finetune", "load", "pretrain", "recipes", "study"]


def load(workdir: str, compute_dtype: str | None = None) -> Any:
  """The fine-tuned model in ``workdir`` (:class:`jaxtl.tasks.predictor.FineTuned`),
  ready to ``.predict(texts)``. ``compute_dtype`` (auto, float32, bfloat16;
  None: as fine-tuning was asked): see :func:`jaxtl.tasks.predictor.load`.
  """
  # heavy: JAX and Flax; ``import jaxtl`` (and every jaxtl.runtime import, before
  # the CLI tunes the process for JAX) must not load them
  from jaxtl.tasks import predictor  # pylint: disable=g-import-not-at-top
  return predictor.load(workdir, compute_dtype)


def pretrain(config: Any, workdir: str) -> dict[str, Any]:
  """``jaxtl pretrain`` from Python: trains ``config`` (a recipe's
  ConfigDict, or its name as ``--config`` takes it) in ``workdir``, resuming
  what is there; returns the final evaluation. See :func:`jaxtl.training.run`."""
  return _run("pretrain", config, workdir)


def finetune(config: Any, workdir: str) -> dict[str, Any]:
  """``jaxtl finetune`` from Python: fine-tunes ``config`` (a recipe's
  ConfigDict, or its name) in ``workdir``, resuming what is there; returns
  the results it writes to ``results.json``. See :func:`jaxtl.training.run`."""
  return _run("finetune", config, workdir)


def study(config: Any, workdir: str) -> dict[str, Any]:
  """``jaxtl study`` from Python: the transfer study of ``config`` in
  ``workdir``; returns its cells. See :func:`jaxtl.training.run`."""
  return _run("study", config, workdir)


def _run(mode: str, config: Any, workdir: str) -> dict[str, Any]:
  from jaxtl import training  # pylint: disable=g-import-not-at-top  # heavy: JAX
  return training.run(mode, config, workdir)
