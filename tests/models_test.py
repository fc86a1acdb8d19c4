"""Property tests for the Transformer stacks: causality, padding, packing, scan."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from jaxtl.models import TransformerConfig, build_model
from jaxtl.models import attention, dropout, layers, masks, transformer

TINY = dict(vocab_size=97, d_model=32, num_heads=4, head_dim=8, mlp_dim=64,
            num_layers=2, max_len=32, dropout_rate=0.0)
FAMILIES = {
    "bert": dict(family="encoder", pre_norm=False, embed_norm=True,
                 type_vocab_size=2, lm_head_transform=True, lm_head_bias=True),
    "gpt2": dict(family="decoder", activation="gelu_new"),
    "t5": dict(family="encoder_decoder", position="relative", norm="rmsnorm",
               use_bias=False, scale_attention=False, gated_mlp=True,
               scale_tied_logits=True, relative_buckets=8,
               relative_max_distance=16),
}


def make(name, **kw):
  cfg = TransformerConfig(**{**TINY, **FAMILIES[name], **kw})
  return cfg, build_model(cfg)


def tokens(shape, seed=0):
  return jax.random.randint(jax.random.key(seed), shape, 4, TINY["vocab_size"])


def run(model, params, toks, dec=None, **kw):
  """``model`` applied, jitted: one compile per model and options, where
  eager dispatch compiled each of a model's hundreds of ops on its own."""
  arrays = {k: v for k, v in kw.items() if not isinstance(v, (bool, str))}
  options = tuple(sorted((k, v) for k, v in kw.items() if k not in arrays))
  return _jitted_apply(model, options)(params, toks, dec, arrays)


@functools.lru_cache(maxsize=None)
def _jitted_apply(model, options):
  def apply(params, toks, dec, arrays):
    args = ((toks, toks if dec is None else dec) if model.config.family == "encoder_decoder"
            else (toks,))
    return model.apply({"params": params}, *args, **arrays, **dict(options))
  return jax.jit(apply)


def init(model, toks):
  """``model``'s parameters (the same for any ``toks``: they do not depend
  on the batch's shape)."""
  del toks
  return _jitted_init(model)()


@functools.lru_cache(maxsize=None)
def _jitted_init(model):
  # One compile per model, at one shape: a model's init program (a random
  # draw per parameter) takes longer to compile than its forward pass
  # (tiny T5: 3.6 s against 0.4 s).
  one = jnp.ones((1, 1), jnp.int32)
  args = (one, one) if model.config.family == "encoder_decoder" else (one,)
  return jax.jit(lambda: nn.unbox(model.init(jax.random.key(1), *args)["params"]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_future_tokens_do_not_change_past_outputs(name):
  _, model = make(name)
  x = tokens((2, 12))
  params = init(model, x)
  y = x.at[:, 7:].set(5)
  if name == "t5":  # The decoder is causal; the encoder sees everything.
    a = run(model, params, x, dec=x)["logits"]
    b = run(model, params, x, dec=y)["logits"]
  else:
    a, b = run(model, params, x)["logits"], run(model, params, y)["logits"]
  np.testing.assert_allclose(a[:, :7], b[:, :7], atol=1e-6)
  assert not np.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.slow
def test_causal_gradient_is_zero_for_future_positions():
  """d logits[t] / d position_embedding[s] vanishes exactly for s > t."""
  _, model = make("gpt2")
  x = tokens((1, 10))
  params = init(model, x)
  t = 4

  def out_at_t(pos_table):
    p = jax.tree.map(lambda a: a, params)
    p["stack"]["embedder"]["position_embedding"] = pos_table
    return run(model, p, x)["logits"][0, t].sum()

  grad = jax.grad(out_at_t)(params["stack"]["embedder"]["position_embedding"])
  norms = np.abs(np.asarray(grad)).sum(-1)
  assert np.all(norms[t + 1:] == 0.0)
  assert np.all(norms[:t + 1] > 0.0)


def test_off_the_cpu_rows_counted_from_0_share_one_relative_bias(monkeypatch):
  """Without positions given, a GPU computes T5's bias once for the batch
  ([1, H, T, T]); outputs and gradients are those of the per-row bias
  (positions passed), the last layer at chosen positions included."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  _, model = make("bert", position="relative", relative_buckets=8)
  x = tokens((3, 8))
  at = (jnp.array([0, 1, 2]), jnp.array([0, 7, 5]))
  params = init(model, x)
  counted = jnp.broadcast_to(jnp.arange(8), x.shape)

  def out(p, positions, chosen):
    h = model.apply({"params": p}, x, None, positions, lm_head=False,
                    outputs_at=at if chosen else None)["last_hidden"]
    return jnp.sum(jnp.sin(h))

  for chosen in (False, True):
    shared, per_row = (jax.jit(jax.value_and_grad(out), static_argnums=2)(params, pos, chosen)
                       for pos in (None, counted))
    for u, v in zip(*map(jax.tree.leaves, (shared, per_row))):
      np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  assert "f32[1,4,8,8]" in str(jax.make_jaxpr(lambda p: out(p, None, False))(params))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_padding_does_not_change_unpadded_outputs(name):
  _, model = make(name)
  x = tokens((2, 9))
  params = init(model, x)
  padded = jnp.concatenate([x, jnp.zeros((2, 5), x.dtype)], axis=1)
  seg = jnp.concatenate([jnp.ones((2, 9), jnp.int32), jnp.zeros((2, 5), jnp.int32)], 1)
  if name == "t5":
    a = run(model, params, x)["logits"]
    b = run(model, params, padded, encoder_segment_ids_BS=seg,
            decoder_segment_ids_BT=seg)["logits"]
  else:
    a = run(model, params, x)["logits"]
    b = run(model, params, padded, segment_ids_BT=seg)["logits"]
  np.testing.assert_allclose(a, b[:, :9], atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_packed_segments_match_separate_sequences(name):
  _, model = make(name)
  a, b = tokens((1, 6), 1), tokens((1, 5), 2)
  params = init(model, a)
  packed = jnp.concatenate([a, b], axis=1)
  seg = jnp.array([[1] * 6 + [2] * 5])
  pos = jnp.array([list(range(6)) + list(range(5))])
  out = run(model, params, packed, segment_ids_BT=seg, positions_BT=pos)["logits"]
  np.testing.assert_allclose(out[:, :6], run(model, params, a)["logits"], atol=2e-5)
  np.testing.assert_allclose(out[:, 6:], run(model, params, b)["logits"], atol=2e-5)


def _stack_layers(params, n):
  """Per-layer params (layer_0, layer_1, ...) -> the nn.scan layout (layers, stacked)."""
  flat = traverse_util.flatten_dict(params)
  out = {}
  for path, value in flat.items():
    idx = next((i for i, p in enumerate(path) if p.startswith("layer_")), None)
    if idx is None:
      out[path] = value
    elif path[idx] == "layer_0":
      key = path[:idx] + ("layers",) + path[idx + 1:]
      out[key] = jnp.stack([flat[path[:idx] + (f"layer_{i}",) + path[idx + 1:]]
                            for i in range(n)])
  return traverse_util.unflatten_dict(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_scan_and_remat_match_the_loop(name):
  _, model = make(name)
  _, scanned = make(name, scan_layers=True, remat="full")
  x = tokens((2, 8))
  params = init(model, x)
  s_params = _stack_layers(params, TINY["num_layers"])
  assert jax.tree.structure(s_params) == jax.tree.structure(init(scanned, x))
  a = run(model, params, x, return_hidden=True)
  b = run(scanned, s_params, x, return_hidden=True)
  np.testing.assert_allclose(a["logits"], b["logits"], atol=1e-5)
  for ha, hb in zip(a["hidden_states"], b["hidden_states"]):
    np.testing.assert_allclose(ha, hb, atol=1e-5)
  loss = lambda m, p: run(m, p, x)["logits"].mean()
  ga = _stack_layers(jax.grad(lambda p: loss(model, p))(params), TINY["num_layers"])
  gb = jax.grad(lambda p: loss(scanned, p))(s_params)
  for u, v in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(u, v, atol=1e-6)


@pytest.mark.parametrize("name,kw", [
    ("bert", {}), ("gpt2", {}),
    ("bert", dict(position="relative", relative_buckets=8, adapter_dim=4,
                  row_major_dots=True, attention_impl="xla"))])
def test_the_last_layer_run_at_chosen_positions_gives_their_states_and_gradients(
    name, kw):
  _, model = make(name, **kw)
  x = tokens((3, 8))
  seg = jnp.array([[1] * 5 + [2] * 3, [1] * 8, [1] * 6 + [0] * 2])
  at = (jnp.array([0, 0, 1, 2]), jnp.array([0, 5, 7, 5]))
  w = jax.random.normal(jax.random.key(2), (4, 1, TINY["d_model"]))
  params = init(model, x)

  @functools.partial(jax.jit, static_argnums=1)
  def states(p, chosen):
    h = model.apply({"params": p}, x, seg, lm_head=False,
                    outputs_at=at if chosen else None)["last_hidden"]
    return h if chosen else transformer.at_positions(h, at)

  whole, picked = states(params, False), states(params, True)
  assert picked.shape == (4, 1, TINY["d_model"])
  np.testing.assert_allclose(picked, whole, atol=2e-5)
  grads = [jax.grad(lambda p, c=c: (w * states(p, c)).sum())(params) for c in (False, True)]
  for u, v in zip(*map(jax.tree.leaves, grads)):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_hidden_states_attentions_and_jit(name):
  cfg, model = make(name)
  x = tokens((2, 8))
  params = init(model, x)
  out = run(model, params, x, return_hidden=True, return_attention=True)
  prefix = "encoder_" if name == "t5" else ""
  assert len(out["hidden_states"]) == cfg.num_layers + 1
  assert len(out[prefix + "hidden_states"]) == cfg.num_layers + 1
  assert out["attentions"][0].shape == (2, cfg.num_heads, 8, 8)
  np.testing.assert_allclose(out["attentions"][0].sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(out["hidden_states"][-1], out["last_hidden"])
  # The explicit-weights path and XLA's fused kernel agree; so do jit and eager.
  fused = run(make(name, attention_impl="xla")[1], params, x)["logits"]
  np.testing.assert_allclose(out["logits"], fused, atol=1e-5)
  jitted = jax.jit(lambda p, t: run(model, p, t)["logits"])(params, x)
  np.testing.assert_allclose(jitted, fused, atol=1e-5)
  if name == "gpt2":  # causal weights are zero above the diagonal.
    w = np.asarray(out["attentions"][1])
    assert np.all(np.triu(w[0, 0], k=1) == 0)


def test_dropout_is_random_in_training_and_off_in_eval():
  _, model = make("gpt2", dropout_rate=0.3, attention_dropout_rate=0.3)
  x = tokens((2, 8))
  params = init(model, x)
  f = lambda seed: run(model, params, x, deterministic=False,
                       rngs={"dropout": jax.random.key(seed)})["logits"]
  assert not np.allclose(f(0), f(1))
  np.testing.assert_allclose(f(0), f(0))
  np.testing.assert_allclose(run(model, params, x)["logits"],
                             run(model, params, x)["logits"])


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_drops_at_its_rate_and_keeps_the_mean(rate):
  x = jnp.ones((64, 1001))  # an odd last axis: half of a last 32-bit word unused
  y = np.asarray(dropout.Dropout(rate).apply(
      {}, x, deterministic=False, rngs={"dropout": jax.random.key(0)}))
  dropped = np.mean(y == 0)
  assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / y.size)
  np.testing.assert_allclose(np.unique(y[y != 0]), 1 / (1 - rate), rtol=1e-4)
  assert abs(y.mean() - 1) < 0.02


def test_dropout_edge_rates_and_eval_mode():
  x = jnp.arange(1.0, 7.0).reshape(2, 3)
  apply = lambda rate, det: dropout.Dropout(rate).apply(
      {}, x, deterministic=det, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_array_equal(apply(0.0, False), x)
  np.testing.assert_array_equal(apply(0.7, True), x)
  np.testing.assert_array_equal(apply(1.0, False), jnp.zeros_like(x))
  assert dropout.Dropout(0.5).apply({}, jnp.float32(3.0), deterministic=False,
                                   rngs={"dropout": jax.random.key(1)}).shape == ()


def test_dropout_mask_is_the_same_however_it_is_sharded():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  shape = (8, 8, 10)
  draw = lambda spec: jax.jit(
      lambda k: dropout.dropout_keep_mask(k, 0.3, shape),
      out_shardings=jax.sharding.NamedSharding(mesh, spec))(jax.random.key(3))
  whole = np.asarray(draw(jax.sharding.PartitionSpec()))
  np.testing.assert_array_equal(np.asarray(draw(jax.sharding.PartitionSpec("a", "b"))), whole)
  np.testing.assert_array_equal(np.asarray(draw(jax.sharding.PartitionSpec(None, "a", "b"))), whole)


def test_hashed_words_look_random():
  """Dropout's counter hash: every bit fair, no correlation between
  neighbours along either axis or between keys, bytes uniform."""
  key, other = jax.random.key(5), jax.random.key(6)
  words = np.asarray(dropout.hashed_words(key, (64, 4096)))
  bits = lambda w: ((w[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.float32)
  b = bits(words)
  tol = 5 * 0.5 / np.sqrt(words.size)  # five standard errors of a fair bit's mean
  assert np.all(np.abs(b.mean(axis=(0, 1)) - 0.5) < tol)
  # A pair of independent fair bits agrees with probability 1/2.
  for x, y in [(b[:, 1:], b[:, :-1]), (b[1:], b[:-1]),
               (b, bits(np.asarray(dropout.hashed_words(other, (64, 4096)))))]:
    assert np.all(np.abs((x == y).mean(axis=(0, 1)) - 0.5) < 2 * tol)
  counts = np.bincount((words & 0xFF).ravel(), minlength=256)
  expected = words.size / 256
  chi2 = ((counts - expected) ** 2 / expected).sum()
  assert chi2 < 255 + 5 * np.sqrt(2 * 255)  # 255 degrees of freedom, five sigma
  with pytest.raises(ValueError, match="overflow the 32-bit counter"):
    jax.eval_shape(lambda k: dropout.hashed_words(k, (2, 2**20, 2**13)), key)


@pytest.mark.parametrize("name, reference", [
    ("gelu", lambda x: jax.nn.gelu(x, approximate=False)),
    ("gelu_new", lambda x: jax.nn.gelu(x, approximate=True)),
    ("silu", jax.nn.silu)])
def test_activations_match_jax_and_keep_their_dtype(name, reference):
  """The erf form of the exact GELU and the float32 evaluation of 16-bit
  inputs compute the functions jax.nn defines, gradients included."""
  act = layers.activation_fn(name)
  x = jnp.linspace(-8.0, 8.0, 4001)
  np.testing.assert_allclose(act(x), reference(x), atol=2e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(act))(x),
                             jax.vmap(jax.grad(reference))(x), atol=2e-6)
  x16 = x.astype(jnp.bfloat16)
  assert act(x16).dtype == jnp.bfloat16
  # Rounded once from float32: within half a bf16 ulp of the exact value
  # (or 1e-6 of it, where the erf form's tail at x << 0 rounds to 0).
  exact = reference(x16.astype(jnp.float32))
  assert np.all(np.abs(act(x16).astype(jnp.float32) - exact)
                <= np.abs(exact) * 2.0**-8 + 1e-6)


def test_off_the_cpu_the_tanh_gelus_derivative_is_computed_without_its_tanh(monkeypatch):
  """So a GPU keeps no float32 tanh between the passes (gelu_tanh's
  docstring); the values are jax.nn's, the derivative within 1e-6 of the
  exact one (float64; jax.nn's own is up to 9e-6 off it at x < -7)."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  act = layers.activation_fn("gelu_new")
  x = jnp.linspace(-8.0, 8.0, 64)
  np.testing.assert_allclose(act(x), jax.nn.gelu(x, approximate=True), atol=2e-6)
  tangent = jax.jit(lambda x: jax.jvp(act, (x,), (jnp.ones_like(x),))[1])
  assert "tanh(" not in tangent.lower(x).compile().as_text()
  x64 = np.asarray(x, np.float64)
  c = np.sqrt(2 / np.pi)
  t = np.tanh(c * (x64 + 0.044715 * x64**3))
  exact = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * c * (1 + 3 * 0.044715 * x64**2)
  np.testing.assert_allclose(tangent(x), exact, atol=1e-6)


@pytest.mark.slow
def test_relative_position_buckets():
  rel = jnp.arange(-200, 201)
  bi = masks.relative_position_buckets(rel, True, 32, 128)
  uni = masks.relative_position_buckets(rel, False, 32, 128)
  assert int(bi[200]) == 0 and int(uni[200]) == 0  # distance 0
  assert bi.max() < 32 and uni.max() < 32 and bi.min() >= 0
  assert np.all(np.asarray(uni[201:]) == 0)  # future keys share bucket 0
  assert len(set(np.asarray(bi[195:206]).tolist())) == 11  # small: exact
  past = np.asarray(uni[:200])[::-1]  # distances 1..200
  assert np.all(np.diff(past) >= 0)  # monotone in distance


def test_bad_config_values_name_the_field():
  with pytest.raises(ValueError, match="norm"):
    TransformerConfig(norm="batchnorm")
  with pytest.raises(ValueError, match="unknown model config keys.*hidden"):
    TransformerConfig.from_mapping({"hidden": 3})
  with pytest.raises(ValueError, match="embed_dim must be >= 0"):
    TransformerConfig(embed_dim=-1)
  # A tied head cannot read a [V, 16] table from width 32 without a transform.
  with pytest.raises(ValueError, match="embed_dim=16 .*lm_head_transform=True"):
    TransformerConfig(d_model=32, embed_dim=16)


def test_attention_dropout_cost_is_said_only_where_cudnn_would_run(monkeypatch):
  """Training with attention dropout leaves cuDNN's fused attention unused;
  the run says so where that kernel would otherwise run (a GPU, 16 bits)."""
  cfg, _ = make("bert", dtype="bfloat16", head_dim=16, attention_dropout_rate=0.1)
  assert attention.attention_dropout_cost(cfg) is None  # a CPU: the einsums anyway
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert "attention_dropout_rate=0.0" in attention.attention_dropout_cost(cfg)
  assert attention.attention_dropout_cost(cfg.replace(attention_dropout_rate=0.0)) is None
  assert attention.attention_dropout_cost(cfg.replace(dtype="float32")) is None


def test_causal_spans_split_long_rows_into_equal_blocks():
  assert attention.causal_spans(511) == [(0, 511)]  # short rows: whole
  assert attention.causal_spans(512) == [(0, 256), (256, 512)]
  assert attention.causal_spans(1501) == [(0, 751), (751, 1501)]
  assert attention.causal_spans(8192) == [(0, 2048), (2048, 4096), (4096, 6144),
                                       (6144, 8192)]


@pytest.mark.parametrize("name,row_major", [("gpt2", False), ("gpt2", True),
                                            ("t5", False)])
def test_causal_blocks_give_whole_attentions_outputs_and_gradients(
    name, row_major, monkeypatch):
  """Queries in blocks, each against the keys up to its last, are the
  whole causal attention: on packed segments with padding (GPT-2) and with
  a relative-position bias (T5's decoder), with their gradients."""
  _, model = make(name, row_major_dots=row_major)
  x = tokens((2, 16))
  params = init(model, x)
  seg = jnp.array([[1] * 9 + [2] * 5 + [0] * 2, [1] * 16])
  pos = jnp.array([list(range(9)) + list(range(5)) + [0, 0], list(range(16))])
  kw = (dict(decoder_segment_ids_BT=seg, decoder_positions_BT=pos) if name == "t5"
        else dict(segment_ids_BT=seg, positions_BT=pos))

  def loss(p):
    out = model.apply({"params": p}, *((x, x) if name == "t5" else (x,)), **kw)["logits"]
    return jnp.sum(jnp.where(seg[..., None] > 0, out, 0.0) ** 2), out

  def value_and_grad(blocks):
    monkeypatch.setattr(attention, "CAUSAL_BLOCKS", blocks)  # read when traced
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  assert len(attention.causal_spans(16)) == 1
  (whole, whole_out), whole_grad = value_and_grad(attention.CAUSAL_BLOCKS)
  (blocked, blocked_out), blocked_grad = value_and_grad(((8, 4),))
  assert len(attention.causal_spans(16)) == 4
  np.testing.assert_allclose(blocked_out, whole_out, atol=2e-5)
  np.testing.assert_allclose(blocked, whole, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4),
               blocked_grad, whole_grad)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_batch_of_one_row_is_that_row_of_a_larger_batch(name):
  """Norms and softmaxes run a one-row batch on the row alone
  (layers.without_unit_batch); outputs and gradients stay the row's."""
  _, model = make(name)
  x = tokens((2, 10))
  params = init(model, x)

  def loss(p, toks):
    out = model.apply({"params": p}, *((toks, toks) if name == "t5" else (toks,)))
    return jnp.sum(out["logits"][0] ** 2), out["logits"]

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (one, one_out), one_grad = step(params, x[:1])
  (two, two_out), two_grad = step(params, x)
  np.testing.assert_allclose(one_out[0], two_out[0], atol=2e-5)
  np.testing.assert_allclose(one, two, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4),
               one_grad, two_grad)
