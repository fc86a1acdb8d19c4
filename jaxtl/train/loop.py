"""The one training loop: pretraining, fine-tuning, the transfer study.

``run(workload, loop_config, ...)`` does what every run needs, the same way
for all of them: sharded init (or resume), the one jitted train step
(gradient accumulation, the non-finite guard, donation), evaluation every N
steps, Orbax checkpoints with exact resume (mid-epoch too: the data
position is saved with the state), keeping the best state, SIGTERM
save-and-exit, stopping after repeated non-finite steps, and metrics
(JSON lines, TensorBoard, a progress bar). What differs between pretraining
and a task is the :class:`~jaxtl.train.workload.Workload`: plain data and
functions, no subclassing (:mod:`jaxtl.train.workload`). A run may go in
:class:`~jaxtl.train.workload.Stage` s (BERT: 90% of the steps at length 128, then
512): one state, optimizer and schedule over all of them, each stage with its
own batches and compiled step.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import numpy as np
import optax

from jaxtl import layout
from jaxtl.data import batches
from jaxtl.train import checkpoint, optim, perf, sharding, stopping, storage
from jaxtl.train import metrics as metrics_lib
from jaxtl.train import step as step_lib
from jaxtl.train import workdir as workdir_lib
from jaxtl.train.stopping import Preempted
from jaxtl.train.workload import LoopConfig, Outcome, Stage, Workload

Array = jax.Array


def check_bad_steps(bad_steps: Array, limit: int, step: int) -> None:
  """Stops the run after ``limit`` consecutive skipped (non-finite) steps."""
  bad = int(bad_steps)
  if bad and limit and bad >= limit:
    raise FloatingPointError(
        f"{bad} consecutive steps up to step {step} had a non-finite loss or "
        f"gradient norm (limit config.train.max_bad_steps={limit}); their "
        "updates were skipped. Lower the learning rate or check the data.")
  if bad:
    logging.warning("step %d: non-finite loss or gradient; update skipped "
                    "(%d in a row)", step, bad)


def stages_of(work: Workload, loop: LoopConfig) -> tuple[Stage, ...]:
  """The workload's stages; a one-stage run is made of its own fields."""
  if not work.stages:
    if work.batches is None or work.loss_fn is None:
      raise ValueError("a Workload needs batches and loss_fn, or stages")
    return (Stage(loop.steps, work.batches, work.loss_fn, loop.batch_size,
                  work.flops_per_example, work.tokens_per_example),)
  if work.batches is not None or work.loss_fn is not None:
    raise ValueError("a Workload has batches and loss_fn, or stages: not both")
  total = sum(s.steps for s in work.stages)
  if total != loop.steps or min(s.steps for s in work.stages) < 1:
    raise ValueError(f"stages of {[s.steps for s in work.stages]} steps: each "
                     f"needs one or more, adding up to the run's {loop.steps}")
  return tuple(work.stages)


def run(work: Workload, loop: LoopConfig, tx: optax.GradientTransformation,
        schedule: optim.Schedule, mesh: jax.sharding.Mesh, rules: Any,
        workdir: str) -> Outcome:
  """Trains ``work`` for ``loop.steps`` steps, resuming from ``workdir``.

  Started again on the same workdir it continues from the newest readable
  checkpoint (state, RNG, data position, evaluation history, the train loss
  since the last evaluation) and ends exactly as an uninterrupted run.
  Raises :class:`Preempted` after a SIGTERM or Ctrl-C (a checkpoint was saved
  first; see :mod:`jaxtl.train.stopping`).
  The workdir is held for the run (:func:`jaxtl.train.workdir.owned`): a
  second run on it fails at once.
  """
  with workdir_lib.owned(workdir, enabled=jax.process_index() == 0):
    return _run(work, loop, tx, schedule, mesh, rules, workdir)


def _best_state(state: Any) -> dict[str, Any]:
  """What ``best/`` keeps of the state: its parameters. Every reader of a
  selected model takes only those, and the optimizer's moments (two more
  copies of the model under AdamW) would triple a save that training waits
  for at each better dev score (MiniLM: 258 MiB a save)."""
  return {"params": state.params}


def _run(work: Workload, loop: LoopConfig, tx: optax.GradientTransformation,
         schedule: optim.Schedule, mesh: jax.sharding.Mesh, rules: Any,
         workdir: str) -> Outcome:
  os.makedirs(workdir, exist_ok=True)
  init_rng, step_rng = jax.random.split(jax.random.key(loop.seed))
  boxed, shardings = step_lib.abstract_sharded_state(
      work.model, tx, work.init_inputs, init_rng, mesh, rules)
  abstract = step_lib.abstract_state(nn.unbox(boxed), shardings)
  ckpt = checkpoint.Checkpointer(layout.checkpoints(workdir),
                                 save_every=loop.checkpoint_every or loop.steps + 1,
                                 keep=max(loop.keep_checkpoints, 1))
  # A disk too full for one checkpoint fails now, not after the first stretch.
  storage.check_space(ckpt.directory, storage.state_bytes(abstract))
  keep_best = work.select is not None or work.evaluate is None
  best_ckpt = checkpoint.Checkpointer(
      layout.best(workdir), save_every=1, keep=1,
      async_save=False) if keep_best else None
  history, best, window_since = [], None, []
  stages = stages_of(work, loop)
  ends = list(itertools.accumulate(s.steps for s in stages))  # each's last step
  rates = jax.device_put(schedule, sharding.replicated(mesh))  # a step input
  shard = sharding.shard_whole_batch if work.whole_batches else sharding.shard_batch

  def open_stage(i: int) -> tuple[batches.Prefetcher, Callable]:
    """Stage ``i``'s batches, being made from now on, and its jitted step."""
    return (batches.Prefetcher(stages[i].batches, loop.prefetch),
            step_lib.jit_train_step(stages[i].loss_fn, work.weight_fn, tx, shardings,
                                    mesh, loop.accum_steps))

  def first_batch(prefetch: batches.Prefetcher) -> Any:
    batch = prefetch.peek()
    if batch is not None and work.prepare is not None:
      batch = work.prepare(batch)
    return None if batch is None else shard(batch, mesh)

  ahead = None  # (first stage's batches, its step, the thread compiling it)
  # A resumed run is initialised by its checkpoint alone: no init is compiled.
  restored = ckpt.restore_latest(abstract)
  if restored is not None:
    state, extra, at = restored
    _restore_position(stages, ends, extra.get("stage", 0), extra["data"], at)
    step_rng = jax.random.wrap_key_data(np.asarray(extra["rng"], np.uint32))
    history, best = list(extra.get("history", [])), extra.get("best")
    # The train loss since the last evaluation, when saved mid-way to it.
    window_since = [extra["train_since"]] if extra.get("train_since") else []
    logging.info("resumed from checkpoint step %d in %s", at, workdir)
    if (moved := schedule_moved(extra, loop.steps, schedule, at)) is not None:
      logging.warning("%s", moved)
    if at >= loop.steps:  # a rerun of a finished run, perhaps with a new lr
      logging.warning("%s was trained to step %d of %d already: this run only evaluates "
                      "it (more steps or epochs train on; other settings need another "
                      "--workdir)", workdir, at, loop.steps)
  else:
    if loop.steps:  # the first stage's step compiles while the state is made
      batches_0, step_0 = open_stage(bisect.bisect_left(ends, 1))
      ahead = (batches_0, step_0, step_lib.compile_ahead(
          step_0, abstract, lambda: first_batch(batches_0), step_rng, rates, mesh, rules))
    try:
      state = step_lib.init_sharded_state(
          work.model, tx, work.init_inputs, init_rng, mesh, rules, shardings,
          loaded=work.init_params() if work.init_params is not None else None)
    except BaseException:
      if ahead is not None:
        _abandon(ahead)
      raise

  writer = metrics_lib.MetricsWriter(  # a finish record belongs to a run's end
      workdir, enabled=jax.process_index() == 0,
      keep_through=-1 if restored is None else at, drop_splits=(work.finish_name,))
  peak = loop.peak_flops or perf.peak_flops_per_device(dtype=work.model.config.dtype)
  start = int(state.step)
  rng_data = np.asarray(jax.random.key_data(step_rng)).tolist()
  eval_metrics: dict[str, float] = {}

  def run_eval(at: int) -> dict[str, float]:
    out = work.evaluate(state.params)
    writer.write(at, work.eval_name, out)
    return out

  def save(at: int, force: bool) -> None:  # the window is fetched only to save
    since = metrics_lib.loss_totals(window_since + jax.device_get(window))
    ckpt.save(at, state, {"data": prefetch.get_state(), "stage": k, "rng": rng_data,
                          "history": history, "best": best, "train_since": since,
                          "steps": loop.steps, "lr": float(schedule(at))},
              force=force)

  prefetch = bar = p_step = final = None
  window, k, stop = [], 0, None
  try:
    with stopping.handled(), jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      if start == 0 and work.info:
        writer.write(0, "info", work.info)
      if start == 0 and loop.eval_at_start and work.evaluate is not None:
        eval_metrics = run_eval(0)
      bar = metrics_lib.train_progress(loop.steps, start, work.steps_per_epoch,
                                       enabled=writer.enabled)
      eta = metrics_lib.Eta(loop.steps, start)
      prev_bad, at, stage = None, start, None
      t_last = t_since = time.perf_counter()
      for at in range(start + 1, loop.steps + 1):
        if stage is None or at > ends[k]:  # the run's first step, or a new stage
          k = bisect.bisect_left(ends, at)
          stage = stages[k]
          if prefetch is not None:
            prefetch.close()
          if ahead is not None:  # the run's first stage, opened before the init
            prefetch, p_step, compiling = ahead
            compiling.join()  # else this step would compile a second time
            ahead = None
          else:
            prefetch, p_step = open_stage(k)
          if len(stages) > 1 and at == ends[k] - stage.steps + 1:
            _announce(writer, k, stage, at - 1)
        batch = next(prefetch)
        if work.prepare is not None:
          batch = work.prepare(batch)
        state, m = p_step(state, shard(batch, mesh), step_rng, rates)
        window.append(m)
        ckpt.check()  # a background save that failed stops the run now
        if prev_bad is not None:  # the previous step's: keeps dispatch async
          check_bad_steps(prev_bad, loop.max_bad_steps, at - 1)
        prev_bad = m["bad_steps"]
        metrics_lib.advance(bar, at, work.steps_per_epoch, loop.steps)
        if at % loop.log_every == 0 or at == ends[k]:  # a window never spans stages
          # Timed to when the window's results are on the host, not to when its
          # steps were dispatched (which runs ahead of the device).
          host = jax.device_get(window)
          now = time.perf_counter()
          summary = metrics_lib.summarize_train(
              host, now - t_last, stage.batch_size, stage.flops_per_example, peak,
              stage.tokens_per_example, work.summarize)
          writer.write(at, "train", summary, total=loop.steps, eta=eta(at))
          bar.set_postfix(loss=f"{summary['loss']:.3f}", refresh=False)
          window_since.extend(host)
          window, t_last = [], now
        if (loop.eval_every and at % loop.eval_every == 0) or at == loop.steps:
          window_since.extend(jax.device_get(window))
          seconds = time.perf_counter() - t_since
          entry = {"step": at, "train_loss": metrics_lib.mean_loss(window_since),
                   "train_seconds": round(seconds, 2)}
          improved = work.evaluate is None and at == loop.steps
          if work.evaluate is not None:
            eval_metrics = run_eval(at)
            entry.update(eval_metrics)
            if work.select is not None:
              score = float(work.select(eval_metrics))
              improved = best is None or score > best
              best = score if improved else best
          history.append(entry)
          if keep_best and improved:  # the parameters alone: see _best_state
            best_ckpt.save(at, _best_state(state), {"step": at, work.eval_name: eval_metrics},
                           force=True)
          window_since, window = [], []
          t_since = t_last = time.perf_counter()
        stop = stopping.requested()
        last = (at == loop.steps and loop.save_last) or stop is not None
        if last or at % ckpt.save_every == 0:
          save(at, force=last)
        if stop is not None:
          logging.warning("stopped at step %d after %s; checkpoint saved", at,
                          stopping.name(stop))
          break
      bar.close()
      if prev_bad is not None:
        check_bad_steps(prev_bad, loop.max_bad_steps, at)
      if not eval_metrics and start >= loop.steps and work.evaluate is not None:
        # Already trained: just evaluate (its record is in metrics.jsonl).
        eval_metrics = work.evaluate(state.params)
      if work.finish is not None and stop is None:
        logging.info("the final %s evaluation", work.finish_name)
        try:
          final = work.finish(state)
        except stopping.Interrupted:  # the final state first, so a rerun only finishes
          stop = stopping.requested()
          if prefetch is not None:  # else it was restored from its checkpoint
            save(loop.steps, force=True)
          logging.warning("stopped by %s during the final %s evaluation; the "
                          "trained state is saved", stopping.name(stop), work.finish_name)
        else:
          writer.write(loop.steps, work.finish_name, final)
  finally:
    with contextlib.ExitStack() as closing:  # each runs, whichever raises
      closing.callback(writer.close)
      if best_ckpt is not None:
        closing.callback(best_ckpt.close)
      closing.callback(ckpt.close)
      if prefetch is not None:
        closing.callback(prefetch.close)
      if ahead is not None:  # opened, never reached (an error before the first step)
        closing.callback(_abandon, ahead)
      if bar is not None:  # also puts the console log handlers back
        closing.callback(bar.close)
  if stop is not None:  # callers (the transfer study) must not go on as if done
    raise Preempted(f"stopped by {stopping.name(stop)} at step {at} of {loop.steps} "
                    f"(checkpoint saved in {workdir}); rerun the same command to "
                    "resume", stop)
  return Outcome(state, shardings, history, best, eval_metrics,
                 best_ckpt.directory if keep_best else None, final)


def _abandon(ahead: tuple[batches.Prefetcher, Callable, threading.Thread]) -> None:
  """Closes the first stage's batches (a peek waiting for one wakes) and
  waits for its step's compile, when the run ends before its first step. A
  process that exits while XLA compiles on another thread aborts ("FATAL:
  exception not rethrown") instead of reporting the error that ended it."""
  batches_0, _, compiling = ahead
  batches_0.close()
  compiling.join()


def _restore_position(stages: tuple[Stage, ...], ends: list[int], saved_stage: int,
                      position: Mapping[str, Any], step: int) -> None:
  """Puts the data back where the checkpoint at ``step`` left it: inside
  the stage it was saved in, or (saved at that stage's last step) at the
  start of the next one, whose batches are fresh."""
  if step >= ends[-1]:
    return  # finished: nothing more is read
  if saved_stage < len(stages):
    first = ends[saved_stage - 1] if saved_stage else 0
    if first < step < ends[saved_stage]:
      stages[saved_stage].batches.set_state(position)
      return
    if step == ends[saved_stage]:
      return
  raise ValueError(
      f"the checkpoint at step {step} was saved in stage {saved_stage}, but the "
      f"stages now end at steps {ends}: the stages changed since (config.stages)")


def schedule_moved(extra: Mapping[str, Any], steps: int, schedule: optim.Schedule,
                   at: int) -> str | None:
  """Why a resumed run's learning rate at ``at`` is not the one its
  checkpoint was saved with, or None when it is. A run resumed with more
  steps (to train longer) stretches its schedule, so the rate jumps; said
  once, at the resume, not found later in a loss curve."""
  saved, now = extra.get("lr"), float(schedule(at))
  if saved is None or abs(now - saved) <= 1e-6 * max(abs(saved), 1e-12):
    return None
  why = (f"the run now has {steps} steps, not the {extra['steps']} it was started "
         "with, and its schedule spans them" if extra.get("steps", steps) != steps
         else "the learning-rate settings changed (config.optim)")
  return (f"resuming at step {at} with a learning rate of {now:.4g}, not the "
          f"{saved:.4g} of the checkpoint: {why}")


def _announce(writer: metrics_lib.MetricsWriter, k: int, stage: Stage,
              step: int) -> None:
  """Writes (and logs) that stage ``k`` (config.stages[k]) starts after ``step``."""
  writer.write(step, "stage", {"stage": k, "steps": stage.steps,
                               "batch_size": stage.batch_size, **(stage.info or {})})
