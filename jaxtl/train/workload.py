"""What a training run is given and hands back: plain data, no behaviour.

:class:`Workload` (what a run trains and how it is judged, in
:class:`Stage` s), :class:`LoopConfig` (how long and how often, in steps,
checked before any work: :class:`ConfigError`) and :class:`Outcome` (what a
finished run returns). :func:`jaxtl.train.loop.run` takes the first two and
returns the third; pretraining and fine-tuning build them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax

from jaxtl.train import step as step_lib

Array = jax.Array
Batch = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Stage:
  """A stretch of a run whose batches have their own shapes.

  The state, the optimizer and its schedule carry on from the stage before
  (the schedule spans the whole run); what changes is where batches come
  from and, with their shapes, the loss and so the compiled step.

  Attributes:
    steps: how many steps the stage runs.
    batches: resumable host batches (``next``, ``get_state``, ``set_state``).
    loss_fn: as :attr:`Workload.loss_fn`, for these batches.
    batch_size: global examples per batch, for throughput.
    flops_per_example, tokens_per_example: for tokens/s and MFU.
    info: written to the metrics (split "stage") when the stage starts,
      e.g. its sequence length.
  """
  steps: int
  batches: Any
  loss_fn: Callable
  batch_size: int
  flops_per_example: float = 0.0
  tokens_per_example: int = 0
  info: Mapping[str, float] | None = None


@dataclasses.dataclass(frozen=True)
class Workload:
  """What a run trains and how it is judged: all that differs between
  pretraining and fine-tuning a task.

  Attributes:
    model: the Flax module.
    weight_fn: a batch's total loss weight (the accumulation normaliser).
    init_inputs: keyword arguments of ``model.init``.
    loss_fn: ``(params, batch, rng, normalizer) -> (loss, sums)``; ``sums``
      holds ``loss_sum``, ``correct_sum`` and ``weight_sum``.
    batches: resumable host batches (``next``, ``get_state``, ``set_state``).
    stages: the run in stages, instead of ``loss_fn``, ``batches``,
      ``flops_per_example``, ``tokens_per_example`` and ``loop.batch_size``
      (which make one stage of ``loop.steps``); their steps add up to
      ``loop.steps``.
    evaluate: ``params -> metrics``, run every ``eval_every`` steps; None
      for no evaluation.
    eval_name: the split name metrics are logged under ("eval", "dev").
    select: what "best" means: a score of the eval metrics to maximise.
      The best state is kept in ``workdir/best``; without ``evaluate`` the
      last state is. None: no best state is kept.
    prepare: host-side change to each batch before the step (e.g. cutting
      padding).
    whole_batches: every process reads the whole global batch (fine-tuning,
      whose padding is cut by the batch's longest row), not only its share
      (pretraining's streams); each device then takes its rows by index.
    init_params: ``() -> {path: array}``, called on a fresh (not resumed)
      start: pretrained parameters, by "/"-joined path, that take the place
      of their random initialisation.
    steps_per_epoch: for the progress display only (0: no epochs).
    flops_per_example, tokens_per_example: for tokens/s and MFU.
    info: written once to the metrics at the start of a fresh run.
    finish: ``state -> metrics``, run once when training is complete (a
      fine-tuned model's test score), logged as ``finish_name``. It runs
      under the loop's stop handling: a stop request during it (it calls
      :func:`jaxtl.train.stopping.check`) saves the final state first, so
      the rerun only finishes.
    finish_name: the split its metrics are logged under.
    summarize: a window's summed step metrics -> the logged ones (the
      objective's, or a task head's).
  """
  model: nn.Module
  weight_fn: Callable[[Batch], Array]
  init_inputs: Mapping[str, Any]
  summarize: Callable[[Mapping[str, float]], dict[str, float]]
  loss_fn: Callable | None = None
  batches: Any = None
  stages: tuple[Stage, ...] = ()
  evaluate: Callable[[Any], dict[str, float]] | None = None
  eval_name: str = "eval"
  select: Callable[[Mapping[str, float]], float] | None = None
  prepare: Callable[[Batch], Batch] | None = None
  whole_batches: bool = False
  init_params: Callable[[], Mapping[str, Any]] | None = None
  steps_per_epoch: int = 0
  flops_per_example: float = 0.0
  tokens_per_example: int = 0
  info: Mapping[str, float] | None = None
  finish: Callable[[Any], dict[str, float]] | None = None
  finish_name: str = "test"


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How long and how often: plain numbers, in steps."""
  steps: int
  batch_size: int
  log_every: int = 50
  eval_every: int = 0  # 0: only at the end
  eval_at_start: bool = False
  checkpoint_every: int = 0  # 0: only at the end (see save_last) and on SIGTERM
  save_last: bool = True  # False: the last state only goes to best/
  keep_checkpoints: int = 1
  max_bad_steps: int = 20
  accum_steps: int = 1
  prefetch: int = 2
  peak_flops: float = 0.0  # per device; 0: look the device up
  seed: int = 0
  batch_devices: int = 1  # the mesh splits each batch over this many

  def check(self, keys: Mapping[str, str]) -> "LoopConfig":
    """Returns self, or raises :class:`ConfigError` for the first value outside
    what it allows, naming its config key (``keys``: field -> key; others
    are ``train.FIELD``). Run before any work, so a bad value fails in a
    second with its name, not deep inside (a ZeroDivisionError, a reshape).
    """
    b = self.batch_size
    rules = (
        ("steps", self.steps >= 1, "at least 1"),
        ("batch_size", b >= 1, "at least 1"),
        ("log_every", self.log_every >= 1, "at least 1"),
        ("eval_every", self.eval_every >= 0, "0 (evaluate only at the end) or more"),
        ("checkpoint_every", self.checkpoint_every >= 0,
         "0 (save only at the end and on SIGTERM) or more"),
        ("keep_checkpoints", self.keep_checkpoints >= 1,
         "at least 1: the last checkpoint is what resuming, fine-tuning and export read"),
        ("max_bad_steps", self.max_bad_steps >= 1, "at least 1"),
        ("batch_size", b % self.batch_devices == 0,
         f"a multiple of {self.batch_devices}: config.mesh.shape splits each batch "
         f"over {self.batch_devices} devices"),
        ("accum_steps", self.accum_steps >= 1 and b % max(self.accum_steps, 1) == 0,
         f"at least 1 and a divisor of the batch size {b}"),
    )
    for field, ok, allowed in rules:
      if not ok:
        raise ConfigError(f"config.{keys.get(field, 'train.' + field)}="
                          f"{getattr(self, field)!r}: must be {allowed}")
    return self


class ConfigError(ValueError):
  """A config value outside what it allows; the message names the key."""


@dataclasses.dataclass
class Outcome:
  """What a finished run hands back."""
  state: step_lib.TrainState
  shardings: Any
  history: list[dict[str, Any]]  # one entry per evaluation point
  best: float | None  # the best select() score, None without selection
  eval_metrics: dict[str, float]  # the last evaluation's
  best_dir: str | None  # where the best (or last) state was kept
  final: dict[str, float] | None = None  # Workload.finish's metrics
