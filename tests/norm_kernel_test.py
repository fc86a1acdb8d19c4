"""The Pallas norm kernels (``norm_impl=pallas``), run by Pallas's
interpreter: they compute flax's LayerNorm and RMSNorm, gradients included,
at widths that are not powers of 2 and row counts that are not multiples of
a block, and a model built with them keeps the XLA model's parameters and
its loss. tests/gpu_test.py runs the same comparison compiled by Triton."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.models import TransformerConfig, norm_kernel
from jaxtl.models.config import computing_in

from models_test import init, make, tokens  # the tiny families


def _flax_norm(centered: bool, dtype):
  cls = nn.LayerNorm if centered else nn.RMSNorm
  return cls(epsilon=1e-6, dtype=dtype)


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("centered", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rows,width", [(37, 48), (3, 96), (70, 20)])
def test_kernels_match_flax_outputs_and_gradients(centered, dtype, tol, rows, width):
  keys = jax.random.split(jax.random.key(0), 4)
  x = (3 * jax.random.normal(keys[0], (rows, width)) + 1).astype(dtype)
  params = {"scale": jax.random.normal(keys[1], (width,))}
  if centered:
    params["bias"] = jax.random.normal(keys[2], (width,))
  dz = jax.random.normal(keys[3], (rows, width)).astype(dtype)

  def ours(x, p):
    return norm_kernel.norm(x, p["scale"], p.get("bias"), eps=1e-6, out_dtype=dtype)

  def theirs(x, p):
    return _flax_norm(centered, dtype).apply({"params": p}, x)

  got, got_vjp = jax.vjp(ours, x, params)
  want, want_vjp = jax.vjp(theirs, x, params)
  assert got.dtype == want.dtype and got.shape == want.shape
  assert _rel(got, want) < tol
  (got_dx, got_dp), (want_dx, want_dp) = got_vjp(dz), want_vjp(dz)
  # bf16: flax's autodiff rounds its intermediates to bf16, the kernel
  # computes in float32 and rounds once, so dx differs by about an ulp.
  assert got_dx.dtype == x.dtype and _rel(got_dx, want_dx) < tol
  for name in params:
    assert got_dp[name].dtype == jnp.float32
    assert _rel(got_dp[name], want_dp[name]) < 1e-5, name


@pytest.mark.parametrize("rows", [70, 100])
def test_backward_programs_looping_over_several_blocks(rows, monkeypatch):
  """Few programs, each looping over row blocks, the last ones past the
  rows' end: what long batches get (a few rows here get one block each)."""
  monkeypatch.setattr(norm_kernel, "BACKWARD_PROGRAMS", 1)
  assert norm_kernel.backward_blocks(rows, 32) > 1
  x = jax.random.normal(jax.random.key(0), (rows, 20))
  scale, bias = jax.random.normal(jax.random.key(1), (2, 20))
  dz = jax.random.normal(jax.random.key(2), (rows, 20))
  got = jax.vjp(lambda x, s, b: norm_kernel.norm(x, s, b, eps=1e-6, out_dtype=x.dtype),
                x, scale, bias)[1](dz)
  want = jax.vjp(lambda x, s, b: _flax_norm(True, x.dtype).apply(
      {"params": {"scale": s, "bias": b}}, x), x, scale, bias)[1](dz)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("used", ["both", "residual only"])
def test_residual_gradient_joins_the_norms_inside_the_kernel(used):
  x = jax.random.normal(jax.random.key(0), (19, 40))
  scale, bias = jax.random.normal(jax.random.key(1), (40,)), jnp.zeros((40,))
  dz, dres = jax.random.normal(jax.random.key(2), (2, 19, 40))
  if used == "residual only":
    dz = jnp.zeros_like(dz)

  def ours(x, scale):
    z, passed = norm_kernel.norm_and_residual(x, scale, bias, eps=1e-6, out_dtype=x.dtype)
    return (jnp.sum(z * dz) if used == "both" else 0.0) + jnp.sum(passed * dres)

  def theirs(x, scale):
    z = _flax_norm(True, x.dtype).apply({"params": {"scale": scale, "bias": bias}}, x)
    return jnp.sum(z * dz) + jnp.sum(x * dres)

  got, want = jax.grad(ours, (0, 1))(x, scale), jax.grad(theirs, (0, 1))(x, scale)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_leading_axes_are_rows_and_out_dtype_is_asked_for():
  x = jax.random.normal(jax.random.key(0), (2, 5, 24))
  scale, bias = jnp.full((24,), 2.0), jnp.ones((24,))
  z = norm_kernel.norm(x, scale, bias, eps=1e-6, out_dtype=jnp.bfloat16)
  assert z.shape == x.shape and z.dtype == jnp.bfloat16
  flat = norm_kernel.norm(x.reshape(10, 24), scale, bias, eps=1e-6, out_dtype=jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(z.reshape(10, 24), np.float32),
                                np.asarray(flat, np.float32))
  # Each row normalised: mean 1 (the bias), standard deviation 2 (the scale).
  rows = np.asarray(z, np.float32)
  np.testing.assert_allclose(rows.mean(-1), 1.0, atol=2e-2)
  np.testing.assert_allclose(rows.std(-1), 2.0, atol=2e-2)


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_model_with_pallas_norms_keeps_parameters_and_loss(name):
  x = tokens((2, 9))
  _, xla_model = make(name)
  _, pallas_model = make(name, norm_impl="pallas")
  params = init(xla_model, x)
  assert (jax.tree.map(lambda a: (a.shape, a.dtype), init(pallas_model, x))
          == jax.tree.map(lambda a: (a.shape, a.dtype), params))
  args = (x, x) if name == "t5" else (x,)

  def loss(model, p):
    logits = model.apply({"params": p}, *args)["logits"]
    return jnp.mean(jax.nn.log_softmax(logits)[..., 5])

  want, want_grads = jax.value_and_grad(lambda p: loss(xla_model, p))(params)
  got, got_grads = jax.value_and_grad(lambda p: loss(pallas_model, p))(params)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                          jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_a_mesh_of_more_than_one_device_is_refused():
  devices = jax.devices()
  if len(devices) < 2:
    pytest.skip("needs two devices (the conftest's fake CPUs)")
  mesh = jax.sharding.Mesh(np.array(devices[:2]), ("data",))
  _, model = make("bert", norm_impl="pallas")
  with jax.set_mesh(mesh), pytest.raises(ValueError, match="norm_impl=xla"):
    model.init(jax.random.key(0), tokens((2, 4)))


def test_a_model_trained_with_pallas_norms_loads_with_xla_norms_off_a_gpu():
  trained_on_gpu = TransformerConfig(norm_impl="pallas")
  assert jax.default_backend() != "gpu"
  for dtype in ("", "auto", "float32"):
    assert computing_in(trained_on_gpu, dtype).norm_impl == "xla"
  with pytest.raises(ValueError, match="norm_impl"):
    TransformerConfig(norm_impl="triton")
