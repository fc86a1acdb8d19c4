"""GPU properties: cuDNN's fused attention computes what XLA's does (outputs
and gradients, with padding, packing and T5's learned bias), keeps causality
and padding invariance, and the KV cache and the bf16 train step hold on it.

Skipped where JAX sees no GPU. On one (the conftest defaults JAX to the CPU):

  JAX_PLATFORMS=cuda,cpu python -m pytest tests/gpu_test.py tests/models_test.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.decoding import generate as G
from jaxtl.models import attention

from models_test import init, make, tokens  # the tiny families

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")

BF16 = dict(dtype="bfloat16", head_dim=16, max_len=64)
LENGTH = 16  # cuDNN wants even lengths when a bias is trained


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _inputs(name):
  """Two rows: one packed with two segments and padding, one padded."""
  x = tokens((2, LENGTH))
  seg = jnp.array([[1] * 6 + [2] * 6 + [0] * 4, [1] * 11 + [0] * 5], jnp.int32)
  pos = jnp.array([list(range(6)) * 2 + [0] * 4, list(range(11)) + [0] * 5], jnp.int32)
  if name == "t5":
    return (x, x, seg, seg, pos, pos)
  return (x, seg, pos)


def _loss_and_grads(name, impl, **kw):
  cfg, model = make(name, attention_impl=impl, **BF16, **kw)
  args = _inputs(name)
  params = init(model, args[0])
  live = (args[2] if name == "t5" else args[1]) > 0

  def loss(p):
    logits = model.apply({"params": p}, *args)["logits"].astype(jnp.float32)
    return jnp.sum(jnp.where(live[..., None], jax.nn.log_softmax(logits), 0.0)), logits

  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return cfg, logits * live[..., None], grads


def test_auto_picks_cudnn_for_16_bit_and_xla_for_float32():
  assert attention.attention_impl(make("gpt2", **BF16)[0], jnp.bfloat16) == "cudnn"
  assert attention.attention_impl(make("gpt2")[0], jnp.float32) == "xla"
  assert attention.attention_impl(make("gpt2", head_dim=12)[0], jnp.bfloat16) == "xla"


def _assert_close_grads(got_grads, want_grads):
  """Each gradient leaf close to ``want_grads``' and finite; returns the
  leaves with their paths."""
  flat_got = jax.tree_util.tree_leaves_with_path(got_grads)
  flat_want = dict(jax.tree_util.tree_leaves_with_path(want_grads))
  scale = max(float(jnp.linalg.norm(w)) for w in flat_want.values())
  for path, g in flat_got:
    w = flat_want[path]
    # Relative per leaf, except for leaves whose true gradient is ~0 (the
    # key bias: softmax cancels it), where both sides are rounding noise.
    err = float(jnp.linalg.norm(g - w))
    assert err < 5e-2 * float(jnp.linalg.norm(w)) + 1e-4 * scale, jax.tree_util.keystr(path)
    assert bool(jnp.all(jnp.isfinite(g))), jax.tree_util.keystr(path)
  return flat_got


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_cudnn_outputs_and_gradients_match_xla(name):
  _, got, got_grads = _loss_and_grads(name, "cudnn")
  _, want, want_grads = _loss_and_grads(name, "xla")
  assert _rel(got, want) < 2e-2
  flat_got = _assert_close_grads(got_grads, want_grads)
  if name == "t5":  # T5's relative bias learns only through cuDNN's bias gradient.
    bias = [g for p, g in flat_got if "relative" in jax.tree_util.keystr(p)]
    assert bias and all(float(jnp.abs(g).sum()) > 0 for g in bias)


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_pallas_norms_compiled_by_triton_match_xla(name):
  """norm_impl=pallas's kernels as Triton compiles them (CPUs only run
  them interpreted: tests/norm_kernel_test.py)."""
  _, got, got_grads = _loss_and_grads(name, "xla", norm_impl="pallas")
  _, want, want_grads = _loss_and_grads(name, "xla")
  assert _rel(got, want) < 2e-2
  _assert_close_grads(got_grads, want_grads)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_cudnn_keeps_causality(name):
  _, model = make(name, **BF16)
  x = tokens((2, LENGTH))
  params = init(model, x)
  y = x.at[:, 9:].set(5)
  apply = jax.jit(lambda d: model.apply({"params": params}, *((x, d) if name == "t5" else (d,)))
                  ["logits"])
  a, b = apply(x), apply(y)
  np.testing.assert_array_equal(np.asarray(a[:, :9], np.float32), np.asarray(b[:, :9], np.float32))
  assert not np.allclose(np.asarray(a[:, 9:], np.float32), np.asarray(b[:, 9:], np.float32))


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_cudnn_padding_does_not_change_real_positions(name):
  _, model = make(name, **BF16)
  x = tokens((2, 10))
  params = init(model, x)
  padded = jnp.concatenate([x, jnp.zeros((2, 6), x.dtype)], axis=1)
  seg = jnp.concatenate([jnp.ones((2, 10), jnp.int32), jnp.zeros((2, 6), jnp.int32)], 1)
  a = model.apply({"params": params}, x)["logits"]
  b = model.apply({"params": params}, padded, seg)["logits"]
  assert _rel(b[:, :10], a) < 1e-2


def test_kv_cache_matches_the_full_forward_in_bfloat16():
  cfg, model = make("gpt2", **BF16)
  prompt = np.asarray(tokens((2, 6)))
  params = init(model, jnp.asarray(prompt))
  gen = G.GenerationConfig(max_new_tokens=8)
  out = np.asarray(G.generate(cfg, params, prompt, gen=gen))
  full = np.concatenate([prompt, out], 1)
  logits = model.apply({"params": params}, full)["logits"]
  # Each generated token is the full forward's argmax at its position, up to
  # bf16 near-ties: the chosen token's logit is within rounding of the max.
  picked = jnp.take_along_axis(logits[:, 5:-1], full[:, 6:, None], -1)[..., 0]
  gap = jnp.max(logits[:, 5:-1], -1) - picked
  assert float(jnp.max(gap)) < 0.1, np.asarray(gap)


def test_bfloat16_train_step_on_gpu_learns_and_keeps_float32_state():
  from jaxtl import objectives, train  # pylint: disable=g-import-not-at-top
  from jaxtl.train import optim, sharding  # pylint: disable=g-import-not-at-top
  cfg, model = make("gpt2", **BF16)
  opt = optim.OptimConfig(
      lr=3e-3, warmup_steps=0, schedule="constant", end_lr_ratio=1.0, weight_decay=0.0,
      b1=0.9, b2=0.98, eps=1e-8, clip_norm=1.0, accum_steps=1)
  tx, schedule = optim.make_optimizer(opt, total_steps=20)
  mesh, rules = sharding.make_mesh((-1, 1, 1), jax.devices()[:1]), sharding.make_rules()
  seq = np.asarray(tokens((4, LENGTH + 1)))
  batch = {"decoder_input_tokens": seq[:, :-1], "decoder_target_tokens": seq[:, 1:],
           "decoder_loss_weights": np.ones((4, LENGTH), np.float32)}
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  loss_fn = objectives.make_loss_fn(model)
  weight_fn = lambda b: objectives.loss_weight_total(b, family="decoder")
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state, shardings = train.create_sharded_state(
        model, tx, train.lm_init_inputs(model, batch), jax.random.key(0), mesh, rules)
    step = train.jit_train_step(loss_fn, weight_fn, tx, shardings, mesh)
    device_batch = sharding.shard_batch(batch, mesh)
    losses = []
    for i in range(20):
      state, metrics = step(state, device_batch, jax.random.key(i), schedule)
      losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
  assert all(np.isfinite(losses)) and losses[-1] < 0.7 * losses[0], losses
  assert int(state.skipped_steps) == 0
