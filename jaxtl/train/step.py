"""The pure train step, sharded state init, and the step's one jit site.

The step is one module-level pure function ``(state, batch, rng, schedule)
-> (state, metrics)``; :func:`jit_train_step` is the only place it is jitted, with
explicit in/out shardings and the state donated, for the training loop and
the benchmarks alike. State is initialised through ``jax.eval_shape`` ->
shardings -> jitted init, so the full state never has to fit on one device.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct, traverse_util

from jaxtl.models.config import input_side
from jaxtl.models.family import family_of
from jaxtl.train import optim, sharding

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
               init_inputs: Mapping[str, Any], rng: Array,
               loaded: Mapping[str, Any] | None = None) -> TrainState:
  """Fresh (logically boxed) state; call under ``jax.eval_shape`` or jit.

  ``init_inputs``: keyword arguments of ``model.init`` (example inputs).
  ``loaded``: parameters by "/"-joined path (pretrained weights) that take
  the place of their fresh initialisation, before the optimizer state is
  made from the parameters.
  """
  params = model.init(rng, **init_inputs)["params"]
  if loaded:
    flat = traverse_util.flatten_dict(params, sep="/")
    for name, value in loaded.items():
      fresh = flat[name]
      value = jnp.asarray(value, nn.unbox(fresh).dtype)
      flat[name] = (fresh.replace_boxed(value) if isinstance(fresh, nn.meta.AxisMetadata)
                    else value)
    params = traverse_util.unflatten_dict(flat, sep="/")
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=tx.init(params),
                    bad_steps=jnp.zeros((), jnp.int32),
                    skipped_steps=jnp.zeros((), jnp.int32))


def lm_init_inputs(model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
  """Example inputs for initialising a pretraining model from a batch."""
  if family_of(model.config).seq2seq:
    return {"encoder_tokens_BS": batch["encoder_input_tokens"][:1],
            "decoder_tokens_BT": batch["decoder_input_tokens"][:1]}
  p = input_side(model.config.family)
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
                         mesh: jax.sharding.Mesh, rules,
                         loaded: Mapping[str, Any] | None = None
                         ) -> tuple[TrainState, Any]:
  """Initialises the state directly into its shardings; returns (state, shardings)."""
  _, shardings = abstract_sharded_state(model, tx, example_batch, rng, mesh, rules)
  state = init_sharded_state(model, tx, example_batch, rng, mesh, rules, shardings,
                             loaded)
  return state, shardings


def init_sharded_state(model: nn.Module, tx: optax.GradientTransformation,
                       example_batch: Mapping[str, np.ndarray], rng: Array,
                       mesh: jax.sharding.Mesh, rules, shardings: Any,
                       loaded: Mapping[str, Any] | None = None) -> TrainState:
  """The state, initialised by one jitted program into ``shardings`` (from
  :func:`abstract_sharded_state`), with the ``loaded`` parameters in place.

  The loaded parameters enter that program as arguments, each already on
  its own sharding, so XLA drops the random initialisation of every
  parameter they replace: fine-tuning a pretrained model compiles and runs
  the init of its new head only (MiniLM with a new classifier on the 2-core
  AVX2 EPYC: the init's compile 7.1-7.6 -> 1.1 s).
  """
  where = traverse_util.flatten_dict(shardings.params, sep="/")
  loaded = {name: jax.device_put(value, where[name])
            for name, value in (loaded or {}).items()}
  init_fn = functools.partial(init_state, model, tx, example_batch)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(lambda r, pre: nn.unbox(init_fn(r, pre)),
                   out_shardings=shardings)(rng, loaded)


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


def keep_if_finite(finite: Array, update: Callable, grads: Any, params: Any,
                   opt_state: Any, *, select: bool) -> tuple[Any, Any]:
  """``update(grads, params, opt_state)`` where ``finite``, else the old state.

  Which form is faster depends on the back end (docs: studies/performance):
  - A ``lax.cond`` (``select=False``) lets XLA:CPU update the donated
    parameters and optimizer state in place; a select keeps new and old
    alive and copies every parameter and both Adam moments each step (4-7%
    of the MiniLM CPU step).
  - XLA:GPU runs a conditional by copying its predicate to the host and
    waiting for it, a stall in every step; there the select
    (``select=True``) was faster (GPT-2 small, 16 x 1024 on an H100: 46.7
    against 47.7 ms) at the same peak memory.
  """
  if select:
    new = update(grads, params, opt_state)
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, (params, opt_state))
  return jax.lax.cond(finite, update, lambda g, p, o: (p, o), grads, params, opt_state)


def apply_update(tx: optax.GradientTransformation, grads: Any, params: Any,
                 opt_state: Any, grad_norm: Array, finite: Array,
                 schedule: optim.Schedule) -> tuple[Any, Any]:
  """``tx``'s update of ``params`` and ``opt_state`` where ``finite``, else
  both as they were (:func:`keep_if_finite`, in the back end's faster
  form). ``grad_norm`` is the gradients' global norm, which the
  optimizer's clipping (:func:`jaxtl.train.optim.clip_by_global_norm`)
  takes instead of computing it again."""

  def update(grads, params, opt_state):
    updates, opt_state = optax.with_extra_args_support(tx).update(
        grads, opt_state, params, grad_norm=grad_norm, schedule=schedule)
    return optax.apply_updates(params, updates), opt_state

  return keep_if_finite(finite, update, grads, params, opt_state,
                        select=jax.default_backend() == "gpu")


def train_step(state: TrainState, batch: Mapping[str, Array], rng: Array,
               schedule: optim.Schedule, *, loss_fn: Callable, weight_fn: Callable,
               tx: optax.GradientTransformation,
               accum_steps: int = 1) -> tuple[TrainState, dict[str, Array]]:
  """One optimizer update. A non-finite loss or gradient skips the update.

  The learning rate's ``schedule`` is an input, not a constant, so one
  compiled step serves every learning rate and run length
  (:class:`jaxtl.train.optim.Schedule`); ``tx`` takes it as the extra
  argument ``schedule``.

  ``weight_fn(batch)`` is the batch's total loss weight, the normaliser that
  makes accumulated micro-batch gradients equal the full-batch gradient.
  """
  step_rng = jax.random.fold_in(rng, state.step)
  normalizer = weight_fn(batch)
  (loss, sums), grads = _accumulate_grads(loss_fn, state.params, batch,
                                          step_rng, normalizer, accum_steps)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  params, opt_state = apply_update(tx, grads, state.params, state.opt_state, grad_norm,
                                   finite, schedule)
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


def evaluate(eval_fn: Callable, params: Any, batches: Iterator[Mapping[str, Any]],
             summarize: Callable[[Mapping[str, Any]], dict[str, float]]
             ) -> dict[str, float]:
  """Sums eval_fn over all batches, then ``summarize`` turns the sums into
  the metrics (the objective's: loss, accuracy, perplexity, ...)."""
  total = None
  for batch in batches:
    sums = eval_fn(params, batch)
    total = sums if total is None else jax.tree.map(jnp.add, total, sums)
  if total is None:
    raise ValueError("evaluation got no batches: the eval split is smaller "
                     "than one batch")
  return summarize(jax.device_get(total))




def jit_train_step(loss_fn: Callable, weight_fn: Callable,
                   tx: optax.GradientTransformation, state_shardings: Any,
                   mesh: jax.sharding.Mesh, accum_steps: int = 1) -> Callable:
  """:func:`train_step` jitted with the state sharded and donated, the batch
  split over the mesh's data axes, the RNG and the schedule replicated."""
  if accum_steps < 1:
    raise ValueError(f"config.optim.accum_steps must be >= 1, got {accum_steps}")
  return jax.jit(
      functools.partial(train_step, loss_fn=loss_fn, weight_fn=weight_fn, tx=tx,
                        accum_steps=accum_steps),
      in_shardings=(state_shardings, sharding.batch_sharding(mesh),
                    sharding.replicated(mesh), sharding.replicated(mesh)),
      out_shardings=(state_shardings, None), donate_argnums=0)


def compile_ahead(step: Callable, abstract: Any, first_batch: Callable[[], Any],
                  rng: Array, rates: Any, mesh: jax.sharding.Mesh, rules: Any
                  ) -> threading.Thread:
  """Compiles the jitted ``step`` in a background thread for a state shaped
  as ``abstract`` and the batch ``first_batch()`` returns (None: nothing to
  compile for), while the caller initialises the state; ``join`` the thread
  before the first step. The step's call then finds its executable in jit's
  cache and does not compile again.

  Any error is left for that call to raise, where it did before: the thread
  only saves time. Fine-tuning MiniLM on TREC on a 2-core EPYC, the step's
  trace and compile (5.9 s) overlap the pretrained load and the init (about
  2 s).
  """
  def compile_step() -> None:
    try:
      batch = first_batch()
      if batch is not None:
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
          step.lower(abstract, batch, rng, rates).compile()
    except Exception as e:  # pylint: disable=broad-except
      logging.debug("compiling the train step ahead failed (%s); it compiles at "
                    "its first call", e)

  thread = threading.Thread(target=compile_step, name="compile_ahead", daemon=True)
  thread.start()
  return thread
