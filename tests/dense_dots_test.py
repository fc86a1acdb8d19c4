"""row_major_dots: the same model and gradients, with every dense dot in
the row-major form XLA:CPU's fast kernels take (jaxtl.models.dense_dots)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.models import dense_dots
from jaxtl.runtime import xla_cpu
from models_test import init, make, run, tokens
from xla_cpu_test import ZEN3


def test_dense_dot_matches_matmul_with_its_gradients():
  k = jax.random.split(jax.random.key(0), 3)
  x, w = jax.random.normal(k[0], (2, 5, 8)), jax.random.normal(k[1], (8, 6))
  loss = lambda dot: lambda x, w: jnp.sin(dot(x, w)).sum()
  want = jax.grad(loss(jnp.matmul), (0, 1))(x, w)
  got = jax.grad(loss(dense_dots.dense_dot), (0, 1))(x, w)
  for a, b in zip(want, got):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  kernel = jax.random.normal(k[2], (8, 3, 4))
  np.testing.assert_allclose(dense_dots.project(x, kernel, 1),
                             jnp.einsum("btd,dhk->bthk", x, kernel), rtol=1e-5, atol=1e-5)
  table = jax.random.normal(k[1], (7, 8))  # a tied head's [V, E]: x @ table.T
  for rows in (x, jnp.tile(x, (8, 1, 1))):  # w.T left to XLA, then written out
    want = jax.grad(loss(lambda x, t: x @ t.T), (0, 1))(rows, table)
    got = jax.grad(loss(dense_dots.dense_dot_t), (0, 1))(rows, table)
    for a, b in zip(want, got):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  heads = jnp.einsum("btd,dhk->bthk", x, kernel)
  np.testing.assert_allclose(dense_dots.project(heads, kernel.transpose(1, 2, 0), 2),
                             jnp.einsum("bthk,hkd->btd", heads, kernel.transpose(1, 2, 0)),
                             rtol=1e-5, atol=1e-5)


def test_a_bf16_dense_dot_returns_its_float32_weights_gradient_unrounded():
  k = jax.random.split(jax.random.key(2), 3)
  x = jax.random.normal(k[0], (64, 32)).astype(jnp.bfloat16)
  w = jax.random.normal(k[1], (32, 16))  # float32 parameters of a bf16 layer
  g = jax.random.normal(k[2], (64, 16)).astype(jnp.bfloat16)
  y, vjp = jax.vjp(dense_dots.dense_dot, x, w)
  assert y.dtype == jnp.bfloat16
  dx, dw = vjp(g)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  want = x.astype(jnp.float32).T @ g.astype(jnp.float32)  # exact bf16 products
  np.testing.assert_allclose(dw, want, rtol=1e-6, atol=1e-5)
  assert np.any(dw != dw.astype(jnp.bfloat16).astype(jnp.float32))  # never bf16


def test_a_bf16_tied_head_dot_returns_the_tables_float32_gradient_as_the_table_lies():
  k = jax.random.split(jax.random.key(5), 3)
  x = jax.random.normal(k[0], (2, 40, 16)).astype(jnp.bfloat16)  # 80 rows: w.T written
  table = jax.random.normal(k[1], (24, 16))
  g = jax.random.normal(k[2], (2, 40, 24)).astype(jnp.bfloat16)
  y, vjp = jax.vjp(dense_dots.dense_dot_t, x, table)
  assert y.shape == (2, 40, 24) and y.dtype == jnp.bfloat16
  dx, dtable = vjp(g)
  assert dx.dtype == jnp.bfloat16 and dtable.shape == table.shape
  want = (g.astype(jnp.float32).reshape(80, 24).T @ x.astype(jnp.float32).reshape(80, 16))
  np.testing.assert_allclose(dtable, want, rtol=1e-6, atol=1e-5)
  assert dtable.dtype == jnp.float32


def test_attention_dots_match_einsums_with_their_gradients():
  k = jax.random.split(jax.random.key(3), 3)
  q, kk, v = (jax.random.normal(key, (2, 3, 5, 4)) for key in k)
  p = jax.nn.softmax(jnp.einsum("bhtk,bhsk->bhts", q, kk))

  def loss(scores, mix):
    return lambda q, kk, p, v: jnp.sin(scores(q, kk)).sum() + jnp.cos(mix(p, v)).sum()

  want = jax.grad(loss(lambda a, b: jnp.einsum("bhtk,bhsk->bhts", a, b),
                       lambda a, b: jnp.einsum("bhts,bhsk->bhtk", a, b)),
                  (0, 1, 2, 3))(q, kk, p, v)
  got = jax.grad(loss(dense_dots.attention_scores, dense_dots.attention_mix),
                 (0, 1, 2, 3))(q, kk, p, v)
  for a, b in zip(want, got):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # bf16 operands: float32 scores, values' dtype out, each gradient its operand's.
  half = [a.astype(jnp.bfloat16) for a in (q, kk, p, v)]
  assert dense_dots.attention_scores(*half[:2]).dtype == jnp.float32
  assert dense_dots.attention_mix(*half[2:]).dtype == jnp.bfloat16
  grads = jax.grad(loss(dense_dots.attention_scores, dense_dots.attention_mix),
                   (0, 1, 2, 3))(*half)
  assert all(g.dtype == jnp.bfloat16 for g in grads)


def test_add_bias_sums_its_gradient_in_float32_without_a_reduce_window():
  k = jax.random.split(jax.random.key(1), 2)
  y = jax.random.normal(k[0], (32, 64, 12, 32)).astype(jnp.bfloat16)
  bias = jax.random.normal(k[1], (12, 32))
  np.testing.assert_array_equal(dense_dots.add_bias(y, bias), y + bias.astype(jnp.bfloat16))
  grad = jax.jit(jax.grad(lambda b, y: (dense_dots.add_bias(y, b) * y).sum().astype(
      jnp.float32)))
  got = grad(bias, y)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, y.astype(jnp.float32).sum((0, 1)), rtol=1e-6, atol=1e-4)
  # Autodiff's bf16 sum of the same became a reduce-window (slow on XLA:CPU).
  assert "reduce-window" not in grad.lower(bias, y).compile().as_text()


def _loss_and_grads(name, dtype, row_major, tie=False):
  _, model = make(name, row_major_dots=row_major, dtype=dtype, tie_embeddings=tie)
  x = tokens((8, 12) if tie else (2, 12))  # rows enough for a tied head's w.T
  params = init(model, x)  # the same float32 values whatever the dots and dtype

  def loss(p):
    return run(model, p, x)["logits"].astype(jnp.float32).std()

  return jax.jit(jax.value_and_grad(loss))(params), (model, params, x)


@pytest.mark.parametrize("name,tie", [("bert", False), ("gpt2", True),
                                      pytest.param("gpt2", False, marks=pytest.mark.slow),
                                      pytest.param("t5", False, marks=pytest.mark.slow)])
def test_row_major_dots_compute_the_same_model_and_gradients(name, tie):
  (want, grads), _ = _loss_and_grads(name, "float32", False, tie)
  (got, got_grads), _ = _loss_and_grads(name, "float32", True, tie)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads, got_grads)
  # In bfloat16 both round, differently: within bf16's few digits.
  (half, half_grads), _ = _loss_and_grads(name, "bfloat16", True, tie)
  np.testing.assert_allclose(half, want, rtol=3e-2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      b, a, atol=0.05 * float(np.abs(a).max()) + 1e-6), grads, half_grads)


ROW_MAJOR = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
# Per-head attention, batched over (batch, head): [T, K] x [S, K] or [T, S] x [S, K].
ATTENTION = re.compile(r"lhs_batch_dims=\{0,1\}, lhs_contracting_dims=\{3\}, "
                       r"rhs_batch_dims=\{0,1\}, rhs_contracting_dims=\{[23]\}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_major_dots_leave_no_transposed_dense_dot(dtype):
  """After XLA's passes, every dense dot is ``[M, K] @ [K, N]`` and every
  per-head attention dot one of the two batched forms XLA:CPU's fast kernel
  takes (the embedder's one-hot token-type product aside); in float32 the
  weights' gradients are XLA's ``x.T @ g``, as dense_dots leaves them. The
  MLM head is tied to the token table (``dense_dot_t``)."""
  _, (model, params, x) = _loss_and_grads("bert", dtype, True, tie=True)
  grad = jax.jit(jax.grad(lambda p: run(model, p, x)["logits"].astype(jnp.float32).std()))
  hlo = grad.lower(params).compile().as_text()
  dots = [line for line in hlo.splitlines()
          if re.search(r"= \S+ dot\(", line) and "embedder" not in line]
  dense = [line for line in dots if "lhs_batch_dims" not in line]
  assert len(dense) >= 3 * (6 * 2 + 1)  # q, k, v, out, wi, wo, the head: fwd + 2 bwd
  assert len(dots) - len(dense) >= 2 * 3 * 2  # scores, mix: forward and two backward
  weight_grad = "lhs_contracting_dims={0}, rhs_contracting_dims={0}"
  odd = [line.strip()[:160] for line in dots
         if ROW_MAJOR not in line and not ATTENTION.search(line)
         and not (dtype == "float32" and weight_grad in line)]
  assert not odd, odd
  if dtype == "bfloat16" and xla_cpu.bf16_matmuls(xla_cpu.read_cpu(), {}):
    # Where bf16 matmuls pay, XLA keeps each dense dot's operands bf16: it
    # widens a dot whose transposed operand was left to a layout change.
    types = dict(re.findall(r"(%\S+) = (\w+)\[", hlo))
    widened = [line.strip()[:160] for line in dots
               if any(types.get(name) != "bf16"
                      for name in re.search(r"dot\((%\S+), (%\S+)\)", line).groups())]
    assert not widened, widened


def test_float32_leaves_w_transposed_to_xla_where_a_rule_says_so(monkeypatch):
  """On a CPU of FLOAT32_FOLDED_DX_RULES (a Zen 3 EPYC) the input's gradient
  is XLA's ``g @ w.T``, with nothing written out; the gradients are the same."""
  k = jax.random.split(jax.random.key(4), 2)
  x, w = jax.random.normal(k[0], (16, 8)), jax.random.normal(k[1], (8, 6))
  loss = lambda x, w: jnp.sin(dense_dots.dense_dot(x, w)).sum()
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)  # the suite opts out
  forms = {}
  for cpu in (None, ZEN3):
    monkeypatch.setattr(xla_cpu, "read_cpu", lambda: cpu)
    grad = jax.jit(jax.grad(loss, (0, 1)))
    hlo = grad.lower(x, w).compile().as_text()
    forms[cpu is not None] = ("lhs_contracting_dims={1}, rhs_contracting_dims={1}" in hlo,
                              grad(x, w))
  assert not forms[False][0] and forms[True][0]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               forms[False][1], forms[True][1])


def test_row_major_dots_give_the_same_gradients_on_a_batch_sharded_over_8_devices():
  """The pinned layouts of the backward's transposes (dense_dots.written_out)
  hold under SPMD partitioning: a batch split over 8 devices gives the
  gradients of the unsplit one."""
  _, model = make("bert", row_major_dots=True, dtype="float32", tie_embeddings=False)
  x = tokens((8, 12))
  params = init(model, x)
  loss = jax.jit(jax.value_and_grad(
      lambda p, x: run(model, p, x)["logits"].astype(jnp.float32).std()))
  want = loss(params, x)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  split = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  got = loss(params, split)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), want, got)
