r"""How fast the MiniLM fine-tuning step could be on this CPU (issue 34).

  python launch/step_floor.py                                # 32 x 64, auto
  python launch/step_floor.py --torch                        # and PyTorch's step
  python launch/step_floor.py --batch_size=10 --length=48 --dtype=float32 --torch

Times the step as ``jaxtl benchmark`` runs it, then the three parts no
step can do without, each alone at the rate this XLA:CPU reaches:

- the dense layers' matmuls, forward, input gradient and weight gradient,
  each product in the fastest of its three layouts (row-major, ``a.T @ b``,
  ``a @ b.T``) and with nothing written out to get there;
- attention's scores, softmax and mix, forward and backward, as the step
  computes them (``dense_dots``' batched dots, or einsums);
- the global norm and the AdamW update over the real parameter tree, in
  place, as the train step runs them.

Their sum is a floor: a step that only multiplied, normalised its
attention and updated its weights. PyTorch's step divided by it is the
most jaxtl could be ahead on this CPU with these kernels; what the step
takes beyond it is everything else (layer norms, GELU, dropout, casts,
the backward's transposes, the embeddings) and how it overlaps. The last
layer of a classifier runs its queries at the pooled token alone
(docs: studies/performance), and so does the floor. Prints a markdown
table.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import app, flags
from jax import lax

from jaxtl.models import dense_dots
from jaxtl.runtime import startup
from jaxtl.tools import benchmark, benchmark_torch
from jaxtl.tools.presets import (init_inputs, jaxtl_step, lookup, make_batch, model_config,
                                 optimizer_config, time_alternated, time_steps)
from jaxtl.train import optim, step as train_step

flags.DEFINE_string("preset", "minilm_cls", "A classification preset of jaxtl benchmark.")
flags.DEFINE_integer("batch_size", 32, "Rows a step.")
flags.DEFINE_integer("length", 64, "Tokens a row.")
flags.DEFINE_string("dtype", "auto", "Compute dtype, as jaxtl benchmark's --dtype.")
flags.DEFINE_integer("repeats", 20, "Timed calls per part (the median is reported).")
flags.DEFINE_bool("torch", False, "Also PyTorch's step (transformers, fused AdamW; bf16 "
                  "autocast when jaxtl computes in bf16), in turns with jaxtl's, and the "
                  "ceiling: PyTorch's step over the floor.")
FLAGS = flags.FLAGS

# The layouts of an [m, k] x [k, n] product: row-major, a.T @ b, a @ b.T.
_LAYOUTS = (lambda m, k, n: ((m, k), (k, n), ((1,), (0,))),
            lambda m, k, n: ((k, m), (k, n), ((0,), (0,))),
            lambda m, k, n: ((m, k), (n, k), ((1,), (1,))))


def median_s(fn: Callable, *args: Any) -> float:
  """Median seconds of ``fn(*args)`` over ``--repeats`` calls, after one."""
  return time_steps(lambda: jax.block_until_ready(fn(*args)), warmup=1,
                    steps=FLAGS.repeats)


@functools.cache
def product_s(m: int, k: int, n: int, dtype: Any) -> float:
  """The fastest layout of an [m, k] x [k, n] product accumulating in float32
  (timed once a shape: the layers repeat theirs)."""
  best = float("inf")
  for layout in _LAYOUTS:
    lhs, rhs, contract = layout(m, k, n)
    dot = jax.jit(lambda a, b, c=contract: lax.dot_general(
        a, b, (c, ((), ())), preferred_element_type=jnp.float32))
    best = min(best, median_s(dot, jnp.ones(lhs, dtype), jnp.ones(rhs, dtype)))
  return best


def dense_s(rows: int, kv_rows: int, d: int, f: int, dtype: Any) -> float:
  """One layer's dense products, forward and both gradients: the query and
  output projections and the MLP at ``rows`` rows, keys and values at
  ``kv_rows``. The input's gradient has the forward's shapes, the
  weight's contracts the rows."""
  total = 0.0
  for m, k, n, count in ((kv_rows, d, d, 2), (rows, d, d, 2), (rows, d, f, 1),
                         (rows, f, d, 1)):
    total += count * (2 * product_s(m, k, n, dtype) + product_s(k, m, n, dtype))
  return total


def attention_s(cfg: Any, batch: int, length: int, dtype: Any) -> float:
  """One layer's attention, forward and backward, without dropout or masks."""
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, g = (jax.random.normal(key, (batch, cfg.num_heads, length, cfg.head_dim), dtype)
                for key in keys)
  scale = cfg.head_dim ** -0.5

  def attend(q, k, v):
    if cfg.row_major_dots:
      scores = dense_dots.attention_scores(q, k)
    else:
      scores = jnp.einsum("bhtk,bhsk->bhts", q, k, preferred_element_type=jnp.float32)
    with jax.softmax_custom_jvp(True):
      probs = jax.nn.softmax(scores * scale).astype(dtype)
    if cfg.row_major_dots:
      return dense_dots.attention_mix(probs, v)
    return jnp.einsum("bhts,bhsk->bhtk", probs, v)

  return median_s(jax.jit(lambda q, k, v: jax.vjp(attend, q, k, v)[1](g)), q, k, v)


def update_s(params: Any) -> float:
  """The global norm and AdamW with clipping over ``params``, donated, as
  the train step applies them (:func:`jaxtl.train.step.apply_update`)."""
  tx, schedule = optim.make_optimizer(optimizer_config(), total_steps=1000)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)

  def update(params, opt_state, grads):
    norm = optax.tree.norm(grads)
    return train_step.apply_update(tx, grads, params, opt_state, norm, jnp.isfinite(norm),
                                   schedule)

  run = jax.jit(update, donate_argnums=(0, 1))
  state = [jax.tree.map(jnp.copy, params), tx.init(params)]

  def once():
    state[:] = run(*state, grads)
    return state[0]

  return median_s(once)


def initial_params(preset: Any, cfg: Any) -> Any:
  """The preset's parameter tree, as the benchmark's step initialises it."""
  model, _, _ = jaxtl_step(preset, cfg)
  inputs = init_inputs(model, preset, make_batch(preset, 0))
  return jax.jit(lambda r: nn.unbox(model.init(r, **inputs)["params"]))(jax.random.key(0))


def main(argv: list[str]) -> None:
  del argv
  preset = dataclasses.replace(lookup([FLAGS.preset])[0], batch_size=FLAGS.batch_size,
                               length=FLAGS.length)
  if preset.objective != "classify":
    raise app.UsageError(f"--preset={FLAGS.preset} trains {preset.objective}; the floor "
                         "is a classifier's (minilm_cls, tiny_cls)")
  cfg = model_config(preset, FLAGS.dtype)
  dtype, b, t = cfg.jnp_dtype, preset.batch_size, preset.length
  program = benchmark.jaxtl_program(preset, cfg, jax.devices()[:1])
  runs = [program.run_step]
  if FLAGS.torch:
    runs.append(benchmark_torch.torch_program(preset, cfg).run_step)
  steps, _ = time_alternated(runs, warmup=2, steps=3, rounds=4)
  m = b * t
  full_layers = cfg.num_layers - 1  # the last layer's queries: the pooled token
  dense = (full_layers * dense_s(m, m, cfg.d_model, cfg.mlp_dim, dtype)
           + dense_s(b, m, cfg.d_model, cfg.mlp_dim, dtype))
  attention = full_layers * attention_s(cfg, b, t, dtype)
  update = update_s(initial_params(preset, cfg))
  floor = dense + attention + update
  ms = lambda s: f"{1e3 * s:,.1f}"
  print(f"{FLAGS.preset}, {b} x {t}, {cfg.dtype}"
        f"{' (row-major dots)' if cfg.row_major_dots else ''}\n")
  print("| part | ms |\n|---|---:|")
  for name, s in (("the dense layers' matmuls, forward and backward", dense),
                  (f"attention of {full_layers} full layer{'s' * (full_layers != 1)}, "
                   "forward and backward", attention),
                  ("global norm and AdamW update", update),
                  ("**floor** (their sum)", floor),
                  ("**the step** (jaxtl benchmark's)", steps[0]),
                  ("the rest: the step beyond the floor", steps[0] - floor)):
    print(f"| {name} | {ms(s)} |")
  if FLAGS.torch:
    print(f"| PyTorch's step | {ms(steps[1])} |\n\nPyTorch / jaxtl {steps[1] / steps[0]:.2f}x; "
          f"PyTorch / the floor {steps[1] / floor:.2f}x (the most jaxtl could be ahead)")


if __name__ == "__main__":
  startup.tune_process()
  app.run(main)
