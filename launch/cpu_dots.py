r"""Which matmul forms reach XLA:CPU's fast kernels on this CPU (issue 34).

  python launch/cpu_dots.py                 # XLA's defaults
  XLA_FLAGS=--xla_cpu_use_onednn=true python launch/cpu_dots.py   # or any flags

Times single jitted dots at a MiniLM dense layer's shape in float32 and
bfloat16, in the forms a train step makes (a layer's forward, autodiff's
transposed backward dots, the same with the transposed operand
materialised), then a whole dense layer's forward and backward as XLA
differentiates it and as :func:`jaxtl.models.dense_dots.dense_dot` does.
Each row names the kernel XLA chose (YNNPACK, oneDNN, XNNPACK or Eigen's
plain dot). Prints a markdown table.
"""

from __future__ import annotations

import re
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from jaxtl.models import dense_dots
from jaxtl.runtime import xla_cpu
from jaxtl.train import perf

flags.DEFINE_list("shape", ["2048", "384", "1536"], "M, K, N of the dense layer "
                  "(tokens, input width, output width).")
flags.DEFINE_integer("repeats", 20, "Timed calls per row (the median is reported).")
FLAGS = flags.FLAGS

KERNELS = (("ynn", "YNNPACK"), ("onednn", "oneDNN"), ("xnn", "XNNPACK"))


def kernels(hlo: str) -> str:
  """The matmul kernels a compiled module calls."""
  found = {name for tag, name in KERNELS if re.search(rf"%\S*{tag}\S* = ", hlo)
           or re.search(rf'custom_call_target="[^"]*{tag}', hlo, re.I)}
  entry = hlo[hlo.find("ENTRY"):]
  if re.search(r"= \S+ dot\(", entry):
    found.add("Eigen dot")
  return ", ".join(sorted(found)) or "-"


def main(argv: list[str]) -> None:
  del argv
  m, k, n = map(int, FLAGS.shape)
  keys = jax.random.split(jax.random.key(0), 3)
  f32 = jnp.float32
  acc = lambda a, b: jnp.matmul(a, b, preferred_element_type=f32)
  t = dense_dots.materialised_t

  def row(name: str, fn: Callable, args: tuple, flop: float) -> None:
    jitted = jax.jit(fn)
    hlo = jitted.lower(*args).compile().as_text()
    jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(FLAGS.repeats):
      start = time.perf_counter()
      jax.block_until_ready(jitted(*args))
      times.append(time.perf_counter() - start)
    s = float(np.median(times))
    print(f"| {name} | {s * 1e3:.2f} | {flop / s / 1e9:,.0f} | {kernels(hlo)} |", flush=True)

  print(f"{perf.cpu_model()}; {xla_cpu.describe()}; jax {jax.__version__}; "
        f"[{m}, {k}] x [{k}, {n}]\n")
  print("| form | ms | GFLOP/s | kernel |\n|---|---:|---:|---|")
  dot = 2.0 * m * k * n
  for dtype in (jnp.float32, jnp.bfloat16):
    x = jax.random.normal(keys[0], (m, k), dtype)
    w = jax.random.normal(keys[1], (k, n), dtype)
    g = jax.random.normal(keys[2], (m, n), dtype)
    d = jnp.dtype(dtype).name
    row(f"{d} x @ w", lambda x, w: x @ w, (x, w), dot)
    row(f"{d} x @ w, float32 accumulation", acc, (x, w), dot)
    row(f"{d} g @ w.T (backward, dx)", lambda g, w: acc(g, w.T), (g, w), dot)
    row(f"{d} g @ w.T, w.T materialised", lambda g, w: acc(g, t(w)), (g, w), dot)
    row(f"{d} x.T @ g (backward, dw)", lambda x, g: acc(x.T, g), (x, g), dot)
    row(f"{d} x.T @ g, x.T materialised", lambda x, g: acc(t(x), g), (x, g), dot)
    loss = lambda mm: lambda x, w, g: jnp.sum(mm(x, w).astype(f32) * g.astype(f32))
    row(f"{d} dense layer forward + backward, XLA's",
        jax.grad(loss(jnp.matmul), (0, 1)), (x, w, g), 3 * dot)
    row(f"{d} dense layer forward + backward, dense_dots",
        jax.grad(loss(dense_dots.dense_dot), (0, 1)), (x, w, g), 3 * dot)


if __name__ == "__main__":
  app.run(main)
