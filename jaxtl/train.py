"""Training: sharded state init, the pure train/eval steps, and the train loop.

The step is one module-level pure function ``(state, batch, rng) -> (state,
metrics)`` that is jitted at exactly one call site with explicit in/out
shardings and the state donated. State is initialised through
``jax.eval_shape`` -> shardings -> jitted init, so the full state never has
to fit on one device.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import struct

from jaxtl import checkpoint, objectives, optim, perf, sharding
from jaxtl.data import pipeline
from jaxtl.models import TransformerConfig, build_model

Array = jax.Array


@struct.dataclass
class TrainState:
  """Everything that changes during training (and goes into checkpoints)."""
  step: Array
  params: Any
  opt_state: Any
  bad_steps: Array  # consecutive skipped (non-finite) steps
  skipped_steps: Array  # total skipped steps


def init_state(model: nn.Module, tx: optax.GradientTransformation,
               init_inputs: Mapping[str, Any], rng: Array) -> TrainState:
  """Fresh (logically boxed) state; call under ``jax.eval_shape`` or jit.

  ``init_inputs``: keyword arguments of ``model.init`` (example inputs).
  """
  params = model.init(rng, **init_inputs)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=tx.init(params),
                    bad_steps=jnp.zeros((), jnp.int32),
                    skipped_steps=jnp.zeros((), jnp.int32))


def lm_init_inputs(model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
  """Example inputs for initialising a pretraining model from a batch."""
  if model.config.family == "encoder_decoder":
    return {"encoder_tokens_BS": batch["encoder_input_tokens"][:1],
            "decoder_tokens_BT": batch["decoder_input_tokens"][:1]}
  p = objectives.target_prefix(model.config.family)
  return {"tokens_BT": batch[f"{p}_input_tokens"][:1]}


def abstract_state(state: Any, shardings: Any) -> Any:
  """Shapes, dtypes and shardings of ``state``: what a restore lands into."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)


def abstract_sharded_state(model: nn.Module, tx: optax.GradientTransformation,
                           example_batch: Mapping[str, np.ndarray], rng: Array,
                           mesh: jax.sharding.Mesh, rules) -> tuple[Any, Any]:
  """(boxed abstract state, its shardings), with no device memory used."""
  init_fn = functools.partial(init_state, model, tx, example_batch)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init_fn, rng)
    return abstract, sharding.logical_shardings(abstract, mesh, rules)


def create_sharded_state(model: nn.Module, tx: optax.GradientTransformation,
                         example_batch: Mapping[str, np.ndarray], rng: Array,
                         mesh: jax.sharding.Mesh, rules) -> tuple[TrainState, Any]:
  """Initialises the state directly into its shardings; returns (state, shardings)."""
  _, shardings = abstract_sharded_state(model, tx, example_batch, rng, mesh, rules)
  init_fn = functools.partial(init_state, model, tx, example_batch)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(lambda r: nn.unbox(init_fn(r)), out_shardings=shardings)(rng)
  return state, shardings


def _accumulate_grads(loss_fn: Callable, params: Any, batch: Mapping[str, Array],
                      rng: Array, normalizer: Array, accum_steps: int):
  """Sum of micro-batch gradients of loss_sum / normalizer (= full-batch grad)."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if accum_steps == 1:
    return grad_fn(params, batch, rng, normalizer)

  def split(x):  # [B, ...] -> [A, B/A, ...]; micro-batch i takes rows i::A so
    # every device contributes to every micro-batch.
    return x.reshape(x.shape[0] // accum_steps, accum_steps,
                     *x.shape[1:]).swapaxes(0, 1)

  micro = jax.tree.map(split, dict(batch))

  def body(carry, xs):
    mb, i = xs
    out, grads = grad_fn(params, mb, jax.random.fold_in(rng, i), normalizer)
    return jax.tree.map(jnp.add, carry, (out, grads)), None

  zero = jax.eval_shape(lambda: grad_fn(params, jax.tree.map(lambda x: x[0], micro),
                                        rng, normalizer))
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero)
  (out, grads), _ = jax.lax.scan(body, zero, (micro, jnp.arange(accum_steps)))
  return out, grads


def train_step(state: TrainState, batch: Mapping[str, Array], rng: Array, *,
               loss_fn: Callable, weight_fn: Callable,
               tx: optax.GradientTransformation, schedule: optax.Schedule,
               accum_steps: int = 1) -> tuple[TrainState, dict[str, Array]]:
  """One optimizer update. A non-finite loss or gradient skips the update.

  ``weight_fn(batch)`` is the batch's total loss weight, the normaliser that
  makes accumulated micro-batch gradients equal the full-batch gradient.
  """
  step_rng = jax.random.fold_in(rng, state.step)
  normalizer = weight_fn(batch)
  (loss, sums), grads = _accumulate_grads(loss_fn, state.params, batch,
                                          step_rng, normalizer, accum_steps)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  # A cond, not a select of new against old state: XLA then updates the
  # donated parameters and optimizer state in place. A select keeps both
  # alive and copies every parameter and both Adam moments each step (4-7%
  # of the MiniLM CPU step, README "Performance").
  def update(grads, params, opt_state):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.lax.cond(finite, update, lambda g, p, o: (p, o),
                                   grads, state.params, state.opt_state)
  new_state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state,
      bad_steps=jnp.where(finite, 0, state.bad_steps + 1),
      skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32))
  metrics = {**sums, "grad_norm": grad_norm,
             # Skipped steps leave the optimizer's count (and so the
             # schedule) where it was.
             "learning_rate": schedule(state.step - state.skipped_steps),
             "skipped": (~finite).astype(jnp.int32),
             "bad_steps": new_state.bad_steps}
  return new_state, metrics


def eval_step(params: Any, batch: Mapping[str, Array], *, loss_fn: Callable
              ) -> dict[str, Array]:
  """Loss sums on one batch, deterministic (no dropout)."""
  _, sums = loss_fn(params, batch, None)
  return sums


def evaluate(eval_fn: Callable, params: Any, batches: Iterator[Mapping[str, Any]]
             ) -> dict[str, float]:
  """Sums eval_fn over all batches, then summarises (loss, accuracy, ppl)."""
  total = None
  for batch in batches:
    sums = eval_fn(params, batch)
    total = sums if total is None else jax.tree.map(jnp.add, total, sums)
  if total is None:
    raise ValueError("evaluation got no batches: the eval split is smaller "
                     "than one batch")
  return objectives.summarize(jax.device_get(total))


# ----------------------------------------------------------------------------
# The loop.


class _Preempted:
  """Turns SIGTERM (preemption) into a flag the loop checks between steps."""

  def __init__(self):
    self.flag = False
    self._previous = None

  def __enter__(self):
    import signal  # pylint: disable=g-import-not-at-top
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    logging.warning("SIGTERM received: saving a checkpoint, then stopping")
    self.flag = True

  def __exit__(self, *exc):
    import signal  # pylint: disable=g-import-not-at-top
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


MODEL_CONFIG_FILE = "model_config.json"


def save_model_config(cfg: TransformerConfig, workdir: str) -> None:
  with open(os.path.join(workdir, MODEL_CONFIG_FILE), "w") as f:
    json.dump(dataclasses.asdict(cfg), f, indent=1)


def load_model_config(workdir: str) -> TransformerConfig:
  """The architecture a pretraining workdir was trained with."""
  path = os.path.join(workdir, MODEL_CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: init_from must be a jaxtl "
                            "pretraining workdir")
  with open(path) as f:
    values = json.load(f)
  values["lora_targets"] = tuple(values.get("lora_targets", ()))
  return TransformerConfig.from_mapping(values)


def model_config_from(config: Any, vocab_size: int) -> TransformerConfig:
  """config.model -> TransformerConfig; vocab_size 0 means "the tokenizer's"."""
  values = dict(config.model)
  if not values.get("vocab_size"):
    multiple = config.get("vocab_multiple", 128)
    values["vocab_size"] = -(-vocab_size // multiple) * multiple
  elif values["vocab_size"] < vocab_size:
    raise ValueError(f"config.model.vocab_size={values['vocab_size']} is smaller "
                     f"than the tokenizer's {vocab_size} ids")
  return TransformerConfig.from_mapping(values)


def train_and_evaluate(config: Any, workdir: str) -> dict[str, float]:
  """Trains per ``config``, writing checkpoints and metrics into ``workdir``.

  Started again on the same workdir, it resumes from the newest readable
  checkpoint: parameters, optimizer state, step, RNG and data position.
  Returns the final evaluation metrics.
  """
  os.makedirs(workdir, exist_ok=True)
  objectives.check_objective(config.objective.name, config.model.family)
  data = pipeline.DataSetup(config, workdir, process_index=jax.process_index(),
                            process_count=jax.process_count())
  model_cfg = model_config_from(config, data.tokenizer.vocab_size)
  if jax.process_index() == 0:  # Fine-tuning rebuilds the model from this.
    save_model_config(model_cfg, workdir)
  model = build_model(model_cfg)
  mesh = sharding.make_mesh(config.mesh.shape)
  rules = sharding.make_rules(config.mesh.get("rules"))
  total_steps = config.train.steps
  tx, schedule = optim.make_optimizer(config.optim, total_steps)
  loss_fn = objectives.make_loss_fn(model, data.max_predictions,
                                    config.objective.loss_chunk_len)

  train_iter = data.train_iterator()
  rng = jax.random.key(config.seed)
  init_rng, step_rng = jax.random.split(rng)
  state, state_shardings = create_sharded_state(
      model, tx, lm_init_inputs(model, next(data.train_iterator())), init_rng,
      mesh, rules)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"),
                                 save_every=config.train.checkpoint_every,
                                 keep=config.train.keep_checkpoints)
  restored = ckpt.restore_latest(abstract_state(state, state_shardings))
  if restored is not None:
    state, extra, step = restored
    train_iter.set_state(extra["data"])
    step_rng = jax.random.wrap_key_data(np.asarray(extra["rng"], np.uint32))
    logging.info("resumed from checkpoint step %d in %s", step, workdir)

  batch_sharding = sharding.batch_sharding(mesh)
  p_train_step = jax.jit(
      functools.partial(train_step, loss_fn=loss_fn, tx=tx, schedule=schedule,
                        weight_fn=functools.partial(objectives.loss_weight_total,
                                                    family=model_cfg.family),
                        accum_steps=config.optim.accum_steps),
      in_shardings=(state_shardings, batch_sharding, sharding.replicated(mesh)),
      out_shardings=(state_shardings, None), donate_argnums=0)
  p_eval_step = jax.jit(functools.partial(eval_step, loss_fn=loss_fn),
                        in_shardings=(state_shardings.params, batch_sharding))

  writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
  n_params = optim.count_params(state.params)
  flops = perf.flops_per_example(model_cfg, state.params, *data.lengths.values(),
                                 head_positions=data.max_predictions)
  peak = config.train.get("peak_flops") or perf.peak_flops_per_device(
      dtype=model_cfg.dtype)
  logging.info("model: %s, %d parameters; %s rows train / %s eval; unigram "
               "entropy of training tokens %.3f nats", model_cfg.family,
               n_params, data.num_rows(data.train_split),
               data.num_rows(data.eval_split), data.unigram_entropy)
  fresh = int(state.step) == 0
  if fresh:
    writer.write(0, "info", {"params": n_params, "flops_per_example": flops,
                             "unigram_entropy": data.unigram_entropy})

  def run_eval(step):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      batches = (sharding.shard_batch(b, mesh)
                 for b in data.eval_iterator(config.train.eval_batches))
      metrics = evaluate(p_eval_step, state.params, batches)
    writer.write(step, "eval", metrics)
    return metrics

  if fresh:  # The starting point every later eval is compared with.
    run_eval(0)
  start = int(state.step)
  rng_data = np.asarray(jax.random.key_data(step_rng)).tolist()
  metrics = {}
  prefetch = pipeline.Prefetcher(train_iter, config.data.prefetch)
  prev_bad, window = None, []
  t_last, step = time.perf_counter(), start
  with _Preempted() as preempted, jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    bar = tqdm.tqdm(total=total_steps, initial=start, disable=not writer.enabled,
                    dynamic_ncols=True, desc="train")
    for step in range(start + 1, total_steps + 1):
      batch = sharding.shard_batch(next(prefetch), mesh)
      state, m = p_train_step(state, batch, step_rng)
      window.append(m)
      if prev_bad is not None:  # The previous step's: keeps dispatch async.
        _check_bad_steps(prev_bad, config.train.max_bad_steps, step - 1)
      prev_bad = m["bad_steps"]
      bar.update(1)
      if step % config.train.log_every == 0 or step == total_steps:
        now = time.perf_counter()
        summary = _summarize_train(jax.device_get(window), now - t_last,
                                   config.data.batch_size, flops, peak,
                                   sum(data.lengths.values()))
        writer.write(step, "train", summary)
        bar.set_postfix(loss=f"{summary['loss']:.3f}")
        window, t_last = [], time.perf_counter()
      if step % config.train.eval_every == 0 or step == total_steps:
        metrics = run_eval(step)
        t_last = time.perf_counter()
      last = step == total_steps or preempted.flag
      ckpt.save(step, state, {"data": prefetch.get_state(), "rng": rng_data},
                force=last)
      if preempted.flag:
        logging.warning("stopped at step %d after SIGTERM; checkpoint saved", step)
        break
    bar.close()
  if prev_bad is not None:
    _check_bad_steps(prev_bad, config.train.max_bad_steps, step)
  if not metrics and start >= total_steps:  # Already trained: just evaluate.
    metrics = run_eval(total_steps)
  prefetch.close()
  ckpt.close()
  writer.close()
  if preempted.flag:  # callers (the transfer study) must not go on as if done
    raise Preempted(f"stopped by SIGTERM at step {step} of {total_steps} (checkpoint "
                    f"saved in {workdir}); rerun the same command to resume")
  return metrics


class Preempted(RuntimeError):
  """Training stopped early on SIGTERM, after saving a checkpoint."""


def _check_bad_steps(bad_steps: Array, limit: int, step: int) -> None:
  bad = int(bad_steps)
  if bad and limit and bad >= limit:
    raise FloatingPointError(
        f"{bad} consecutive steps up to step {step} had a non-finite loss or "
        f"gradient norm (limit config.train.max_bad_steps={limit}); their "
        "updates were skipped. Lower the learning rate or check the data.")
  if bad:
    logging.warning("step %d: non-finite loss or gradient; update skipped "
                    "(%d in a row)", step, bad)


def _summarize_train(window: list[dict[str, Any]], seconds: float,
                     batch_size: int, flops_per_example: float,
                     peak_per_device: float | None, tokens_per_example: int
                     ) -> dict[str, float]:
  """Averages a window of step metrics and adds throughput and MFU."""
  sums = {k: sum(float(m[k]) for m in window)
          for k in ("loss_sum", "correct_sum", "weight_sum")}
  out = objectives.summarize(sums)
  out["grad_norm"] = float(np.mean([m["grad_norm"] for m in window]))
  out["learning_rate"] = float(window[-1]["learning_rate"])
  out["skipped_steps"] = int(sum(int(m["skipped"]) for m in window))
  steps_per_s = len(window) / max(seconds, 1e-9)
  out["steps_per_s"] = steps_per_s
  out["tokens_per_s"] = steps_per_s * batch_size * tokens_per_example
  if peak_per_device:  # unknown on CPUs: then no MFU rather than a NaN
    out["mfu"] = (steps_per_s * batch_size * flops_per_example
                  / (peak_per_device * jax.device_count()))
  return out


class MetricsWriter:
  """metrics.jsonl (one JSON object per line) + TensorBoard event files."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split,
              **{k: float(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    for k, v in metrics.items():
      self._tb.add_scalar(f"{split}/{k}", float(v), int(step))
    if split != "info":
      logging.info("step %d %s: %s", step, split,
                   ", ".join(f"{k}={float(v):.4g}" for k, v in metrics.items()))

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()
