"""Train step properties: mesh equivalence on 8 fake devices, sharding,
gradient accumulation, and skipping non-finite updates."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from jaxtl import objectives, train
from jaxtl.decoding import sampling
from jaxtl.train import optim, sharding
from jaxtl.models import TransformerConfig, build_model
from jaxtl.models.config import target_side

OPTIM = optim.OptimConfig(
    lr=3e-3, warmup_steps=2, schedule="cosine", end_lr_ratio=0.1,
    weight_decay=0.01, b1=0.9, b2=0.98, eps=1e-8, clip_norm=1.0, accum_steps=1)


def tiny(family="decoder", **kw):
  extra = dict(position="relative", norm="rmsnorm", use_bias=False) \
      if family == "encoder_decoder" else {}
  return TransformerConfig(**{**dict(
      family=family, vocab_size=128, d_model=32, num_heads=4, head_dim=8,
      mlp_dim=64, num_layers=1, max_len=32, dropout_rate=0.0), **extra, **kw})


def batches(family, n, batch=16, length=16, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    toks = rng.integers(4, 128, (batch, length + 1)).astype(np.int32)
    ones = np.ones((batch, length), np.int32)
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
    b = {"decoder_input_tokens": toks[:, :-1], "decoder_target_tokens": toks[:, 1:],
         "decoder_loss_weights": rng.random((batch, length)).round().astype(np.float32),
         "decoder_segment_ids": ones, "decoder_positions": pos}
    if family == "encoder_decoder":
      b.update(encoder_input_tokens=toks[:, 1:], encoder_segment_ids=ones,
               encoder_positions=pos)
    if family == "encoder":
      b = {k.replace("decoder", "encoder"): v for k, v in b.items()}
    out.append(b)
  return out


OBJECTIVE = ml_collections.ConfigDict(dict(  # config.objective's keys the models read
    generator_scale=0.5, generator_layers=1, rtd_weight=50.0,
    loss_chunk_len=objectives.LOSS_CHUNK_LEN))


def run_steps(cfg, mesh_shape, data, *, accum=1, loss_fn=None, optim_cfg=OPTIM,
              objective="mlm"):
  """Runs len(data) train steps on a mesh; returns (losses, final state).
  ``objective`` electra trains its pretrainer (else the family's model)."""
  obj = objectives.get(objective)
  model = obj.build_model(cfg, OBJECTIVE)
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = sharding.make_mesh(mesh_shape, devices)
  rules = sharding.make_rules()
  tx, schedule = optim.make_optimizer(optim_cfg, total_steps=10)
  state, shardings = train.create_sharded_state(
      model, tx, train.lm_init_inputs(model, data[0]), jax.random.key(0), mesh, rules)
  step = train.jit_train_step(
      loss_fn or obj.make_loss_fn(model, None, OBJECTIVE),
      functools.partial(obj.weight_total, family=cfg.family), tx,
      shardings, mesh, accum_steps=accum)
  losses, metrics = [], []
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for b in data:
      state, m = step(state, sharding.shard_batch(b, mesh), jax.random.key(1), schedule)
      m = jax.device_get(m)
      metrics.append(m)
      losses.append(float(m["loss_sum"] / m["weight_sum"]))
  return losses, state, metrics


def test_loaded_params_replace_their_init_on_a_mesh_and_the_rest_keeps_it():
  """Pretrained weights enter the jitted init, sharded: each loaded leaf is
  what was loaded (cast to the parameter's dtype), every other leaf is the
  fresh init it would have been, and the optimizer starts from them."""
  model = build_model(tiny("encoder"))
  mesh = sharding.make_mesh((1, 4, 2), jax.devices()[:8])
  rules = sharding.make_rules()
  tx, _ = optim.make_optimizer(OPTIM, total_steps=10)
  inputs = train.lm_init_inputs(model, batches("encoder", 1)[0])
  fresh, _ = train.create_sharded_state(model, tx, inputs, jax.random.key(0), mesh, rules)
  flat = traverse_util.flatten_dict(fresh.params, sep="/")
  name = "stack/layer_0/mlp/wi/kernel"
  loaded = {name: np.full(flat[name].shape, 0.5, np.float64)}
  state, shardings = train.create_sharded_state(model, tx, inputs, jax.random.key(0),
                                                mesh, rules, loaded=loaded)
  got = traverse_util.flatten_dict(state.params, sep="/")
  np.testing.assert_array_equal(got[name], 0.5)
  assert got[name].dtype == flat[name].dtype and got[name].sharding.spec != P()
  for other, value in got.items():
    if other != name:
      np.testing.assert_array_equal(value, flat[other], err_msg=other)
  assert jax.tree.structure(state) == jax.tree.structure(fresh)
  assert all(x.sharding == s for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_meshes_match_single_device(family):
  data = batches(family, 1) * 4  # the same batch: the loss must fall.
  cfg = tiny(family)
  ref, ref_state, _ = run_steps(cfg, (1, 1, 1), data)
  assert ref[-1] < ref[0]
  # The decoder tries each axis; the encoder-decoder (slow to compile on 8
  # devices) the mesh that uses all three at once.
  shapes = [(8, 1, 1), (2, 4, 1), (2, 2, 2)] if family == "decoder" else [(2, 2, 2)]
  # The (2,2,2) run also computes logits in chunks (a scan over sharded
  # activations and a vocabulary-sharded table).
  chunked = objectives.make_loss_fn(build_model(cfg), chunk_len=5)
  for shape in shapes:
    losses, state, _ = run_steps(cfg, shape, data,
                                 loss_fn=chunked if shape == (2, 2, 2) else None)
    np.testing.assert_allclose(losses, ref, rtol=2e-5, err_msg=str(shape))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
      np.testing.assert_allclose(a, b, atol=2e-5, err_msg=str(shape))


@pytest.mark.slow
def test_electra_meshes_match_single_device():
  """The generator's sampling (a categorical over vocabulary-sharded logits),
  the scatter of its samples, the two losses and a token table narrower than
  both models (embed_dim, projected up by each) shard like the rest."""
  data = batches("encoder", 1) * 3
  cfg = tiny("encoder", pre_norm=False, embed_norm=True, type_vocab_size=2, embed_dim=24,
             lm_head_transform=True)
  ref, ref_state, metrics = run_steps(cfg, (1, 1, 1), data, objective="electra")
  assert metrics[0]["replaced_sum"] > 0 and ref[-1] < ref[0]
  losses, state, _ = run_steps(cfg, (2, 2, 2), data, objective="electra")
  np.testing.assert_allclose(losses, ref, rtol=2e-5)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(a, b, atol=2e-5)


class _FakeTokenizer:
  """What the bart and prefix-LM objectives ask of a tokenizer: id 4 reads '.'."""
  pad_id, eos_id, mask_id, vocab_size = 0, 1, 3, 128

  def decode(self, ids):
    return "." if list(ids) == [4] else "w"


def objective_batches(names, batch=16, length=16, seed=0):
  """One batch whose rows are the examples of ``names`` in turn (objectives
  of one family share their features), from random rows with full stops."""
  data = ml_collections.ConfigDict(dict(seq_len=length, tokenizer=dict(path="")))
  prepared = [objectives.get(n).prepare(_FakeTokenizer(), DENOISING, data) for n in names]
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(batch):
    p = prepared[i % len(prepared)]
    tokens = rng.integers(5, 128, p.row_length).astype(np.int32)
    tokens[rng.random(p.row_length) < 0.1] = 4
    row = {"tokens": tokens, "segment_ids": np.ones_like(tokens),
           "positions": np.arange(p.row_length, dtype=np.int32)}
    rows.append(p.make_example(row, rng))
  return [{k: np.stack([r[k] for r in rows]) for k in rows[0]}]


DENOISING = ml_collections.ConfigDict(dict(
    noise_density=0.3, mean_noise_span_length=3.0, permute_sentence_ratio=1.0))
BART = dict(position="learned", pre_norm=False, embed_norm=True, lm_head_bias=True,
            norm_eps=1e-5, max_len=16)


@pytest.mark.slow
@pytest.mark.parametrize("family,names,kw", [
    ("decoder", ("prefix_lm",), {}),
    ("encoder_decoder", ("bart", "prefix_lm_encdec"), BART)])
def test_new_objectives_match_single_device_on_the_mesh(family, names, kw):
  """BART (on BART's architecture), the encoder-decoder prefix LM and the
  decoder's (its bidirectional prefix sharded with the batch) on 2x2x2."""
  data = objective_batches(names) * 3
  cfg = tiny(family, **kw)
  ref, ref_state, _ = run_steps(cfg, (1, 1, 1), data)
  assert ref[-1] < ref[0]
  losses, state, _ = run_steps(cfg, (2, 2, 2), data)
  np.testing.assert_allclose(losses, ref, rtol=2e-5)
  # Adam divides by the gradient's own scale: where a gradient is ~0, the
  # sharded sums' other rounding moves a weight by a visible part of lr
  # (3e-3); seen at 5e-5 on 1 of 2048 weights on an AMD EPYC, 2026-11-26.
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.slow
def test_sentence_pair_objectives_match_on_a_mesh_with_accumulation():
  # mlm_nsp / mlm_sop's features (they differ only in how pairs are drawn):
  # token types and sentence labels, whose loss is normalised by the full
  # batch, so 2 accumulated micro-batches on 8 devices match one device.
  rng = np.random.default_rng(0)
  b = batches("encoder", 1)[0]
  b["encoder_token_type_ids"] = (np.arange(16) >= rng.integers(2, 14, (16, 1))
                                 ).astype(np.int32)
  b["sentence_labels"] = rng.integers(0, 2, 16).astype(np.int32)
  data = [b] * 3
  cfg = tiny("encoder", type_vocab_size=2, sentence_classes=2, pre_norm=False,
             embed_norm=True)
  ref, ref_state, ref_m = run_steps(cfg, (1, 1, 1), data)
  assert ref_m[-1]["sentence_loss_sum"] < ref_m[0]["sentence_loss_sum"]
  losses, state, m = run_steps(cfg, (2, 2, 2), data, accum=2)
  np.testing.assert_allclose(losses, ref, rtol=2e-5)
  np.testing.assert_allclose([x["sentence_loss_sum"] for x in m],
                             [x["sentence_loss_sum"] for x in ref_m], rtol=2e-5)
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(x, y, atol=2e-5)


@pytest.mark.slow
def test_parameters_are_sharded_as_the_rules_say():
  data = batches("decoder", 1)
  _, state, _ = run_steps(tiny(), (2, 2, 2), data)
  p = state.params
  spec = lambda x: x.sharding.spec
  assert spec(p["token_embed"]["embedding"]) == P("tensor", "fsdp")
  attn = p["stack"]["layer_0"]["self_attention"]
  assert spec(attn["query_kernel"]) == P("fsdp", "tensor", None)
  assert spec(attn["out_kernel"]) == P("tensor", None, "fsdp")
  assert spec(p["stack"]["layer_0"]["mlp"]["wi"]["kernel"]) == P("fsdp", "tensor")
  # Each device holds 1/4 of the embedding (fsdp x tensor = 4 ways).
  emb = p["token_embed"]["embedding"]
  assert emb.addressable_shards[0].data.size == emb.size // 4
  # Adam moments are laid out like the parameters.
  mu = state.opt_state[1][0].mu
  assert spec(mu["token_embed"]["embedding"]) == P("tensor", "fsdp")


@pytest.mark.slow
def test_scanned_layers_shard_with_a_replicated_layer_axis():
  _, state, _ = run_steps(tiny(scan_layers=True), (1, 2, 2), batches("decoder", 1))
  kernel = state.params["stack"]["layers"]["mlp"]["wi"]["kernel"]
  assert kernel.sharding.spec == P(None, "fsdp", "tensor")


@pytest.mark.slow
def test_gradient_accumulation_matches_the_full_batch():
  data = batches("decoder", 3)
  # Two data-parallel devices where there are (the 8 fake CPU devices), so
  # every device contributes to every micro-batch; one on a single GPU.
  mesh = (min(2, jax.device_count()), 1, 1)
  full, full_state, full_m = run_steps(tiny(), mesh, data)
  accum, accum_state, accum_m = run_steps(tiny(), mesh, data, accum=4)
  np.testing.assert_allclose(accum, full, rtol=1e-5)
  np.testing.assert_allclose([m["grad_norm"] for m in accum_m],
                             [m["grad_norm"] for m in full_m], rtol=1e-5)
  # Adam divides by sqrt(v): float noise in near-zero gradients shows up
  # at ~1e-6 in the parameters (whose scale is 0.02), hence the tolerance.
  for a, b in zip(jax.tree.leaves(accum_state.params),
                  jax.tree.leaves(full_state.params)):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("finite", [True, False])
def test_the_guards_cond_and_select_forms_agree(finite):
  # The cond runs on CPUs, the select on GPUs (train.step.keep_if_finite).
  from jaxtl.train.step import keep_if_finite
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  opt_state = {"m": jnp.zeros(3), "count": jnp.array(4)}
  update = lambda g, p, o: (jax.tree.map(lambda x, d: x - d, p, g),
                            {"m": o["m"] + 1, "count": o["count"] + 1})
  grads = jax.tree.map(jnp.ones_like, params)
  run = lambda select: jax.jit(functools.partial(keep_if_finite, select=select),
                               static_argnums=1)(jnp.array(finite), update, grads,
                                                 params, opt_state)
  cond, select = run(False), run(True)
  jax.tree.map(np.testing.assert_array_equal, cond, select)
  expected = update(grads, params, opt_state) if finite else (params, opt_state)
  jax.tree.map(np.testing.assert_array_equal, cond, expected)


@pytest.mark.slow
def test_non_finite_steps_are_skipped_and_counted():
  cfg = tiny()
  model = build_model(cfg)
  base = objectives.make_loss_fn(model)

  def poisoned(params, batch, rng, normalizer=None):
    loss, sums = base(params, batch, rng, normalizer)
    bad = batch["decoder_input_tokens"][0, 0] == 4  # marker row
    return jnp.where(bad, jnp.nan, loss), sums

  data = batches("decoder", 4)
  data[1]["decoder_input_tokens"][0, 0] = 4
  data[2]["decoder_input_tokens"][0, 0] = 4
  for i in (0, 3):
    data[i]["decoder_input_tokens"][0, 0] = 5
  _, clean_state, _ = run_steps(cfg, (1, 1, 1), data[:1])
  _, state, metrics = run_steps(cfg, (1, 1, 1), data[:3], loss_fn=poisoned)
  assert [int(m["skipped"]) for m in metrics] == [0, 1, 1]
  assert [int(m["bad_steps"]) for m in metrics] == [0, 1, 2]
  assert int(state.step) == 3 and int(state.skipped_steps) == 2
  # Skipped updates leave params (and optimizer state) exactly as after step 1.
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(clean_state.params)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(FloatingPointError, match="max_bad_steps=2"):
    train.loop.check_bad_steps(metrics[-1]["bad_steps"], 2, 3)


def test_weight_decay_skips_norms_and_biases():
  mask = optim.decay_mask({"mlp": {"wi": {"kernel": 1, "bias": 1}},
                           "mlp_norm": {"scale": 1}, "token_embed": {"embedding": 1}})
  assert mask == {"mlp": {"wi": {"kernel": True, "bias": False}},
                  "mlp_norm": {"scale": False}, "token_embed": {"embedding": True}}


def test_schedule_warms_up_then_decays():
  sched = optim.make_schedule(OPTIM, total_steps=10)
  values = [float(sched(i)) for i in range(11)]
  assert values[0] == 0.0 and values[2] == pytest.approx(OPTIM.lr)
  assert all(a >= b for a, b in zip(values[2:], values[3:]))
  assert values[10] == pytest.approx(OPTIM.lr * OPTIM.end_lr_ratio)


def test_one_compiled_step_serves_every_learning_rate_and_run_length():
  """The schedule is an input of the step, not a constant in it: runs that
  differ in learning rate, warmup or length lower to the same program (so
  a second run finds it in the persistent cache), and each still trains at
  its own rate."""
  model = build_model(tiny("encoder"))
  mesh, rules = sharding.make_mesh((1, 1, 1), jax.devices()[:1]), sharding.make_rules()
  data = batches("encoder", 1)[0]
  programs, rates = [], []
  for lr, steps, warmup in ((1e-3, 10, 2), (3e-5, 5000, 0)):
    c = dataclasses.replace(OPTIM, lr=lr, warmup_steps=warmup, schedule="linear")
    tx, schedule = optim.make_optimizer(c, total_steps=steps)
    state, shardings = train.create_sharded_state(
        model, tx, train.lm_init_inputs(model, data), jax.random.key(0), mesh, rules)
    obj = objectives.get("mlm")
    step = train.jit_train_step(obj.make_loss_fn(model, None, OBJECTIVE),
                                functools.partial(obj.weight_total, family="encoder"),
                                tx, shardings, mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      batch = sharding.shard_batch(data, mesh)
      programs.append(step.lower(state, batch, jax.random.key(1), schedule).as_text())
      for _ in range(3):
        state, m = step(state, batch, jax.random.key(1), schedule)
      rates.append(float(m["learning_rate"]))
  assert programs[0] == programs[1]
  np.testing.assert_allclose(rates, [1e-3, 3e-5 - (3e-5 - 3e-5 * OPTIM.end_lr_ratio) * 2 / 5000],
                             rtol=1e-5)


def test_mesh_and_rule_errors_name_the_problem():
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.make_mesh((4, 4, 1))
  with pytest.raises(ValueError, match="not a mesh axis"):
    sharding.make_rules({"embed": "model"})


def test_runs_fill_their_mesh_from_one_device_unless_marked():
  """tests/conftest.py: a (-1, 1, 1) mesh takes one device, a named shape
  the devices it names."""
  assert sharding.make_mesh((-1, 1, 1)).devices.size == 1
  assert sharding.make_mesh((1, 4, 2)).devices.size == 8


@pytest.mark.mesh
def test_a_test_marked_mesh_fills_it_from_all_eight():
  assert sharding.make_mesh((-1, 1, 1)).devices.size == 8


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params():
  data = batches("decoder", 1) * 3
  losses, state, _ = run_steps(tiny(dtype="bfloat16"), (1, 1, 1), data)
  ref, _, _ = run_steps(tiny(), (1, 1, 1), data)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
  assert np.isfinite(losses).all() and losses[-1] < losses[0]
  np.testing.assert_allclose(losses, ref, rtol=2e-2)


@pytest.mark.slow
def test_mlm_logits_only_at_masked_positions_give_the_same_loss():
  cfg = tiny("encoder", lm_head_transform=True, lm_head_bias=True)
  model = build_model(cfg)
  b = batches("encoder", 1)[0]
  rng = np.random.default_rng(0)
  w = np.zeros_like(b["encoder_loss_weights"])
  for row in w:
    row[rng.choice(16, 3, replace=False)] = 1.0
  b["encoder_loss_weights"] = w
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), b["encoder_input_tokens"]))["params"]
  full = jax.jit(objectives.make_loss_fn(model))(params, b, None)
  sparse = jax.jit(objectives.make_loss_fn(model, max_predictions=4))(params, b, None)
  np.testing.assert_allclose(sparse[0], full[0], rtol=1e-6)
  for k in full[1]:
    np.testing.assert_allclose(sparse[1][k], full[1][k], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("family,kw", [
    ("decoder", {}),  # tied head (GPT-2)
    ("encoder", dict(lm_head_transform=True, lm_head_bias=True)),  # BERT
    ("encoder_decoder", dict(tie_embeddings=False))])  # T5 v1.1
def test_chunked_cross_entropy_equals_the_whole_logits_one(family, kw):
  cfg = tiny(family, **kw)
  model = build_model(cfg)
  b = batches(family, 1, batch=4)[0]
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), **train.lm_init_inputs(model, b)))["params"]
  p = target_side(family)

  def direct(params):  # the plain way: every logit at once
    logits = objectives.forward(model, params, b)["logits"]
    sums = objectives.token_cross_entropy(logits, b[f"{p}_target_tokens"],
                                          b[f"{p}_loss_weights"])
    return objectives.normalized_loss(sums, None), sums

  (ref, ref_sums), ref_grads = jax.jit(jax.value_and_grad(direct, has_aux=True))(params)
  for chunk_len in (0, 5):  # one chunk; 4 uneven ones (T=16)
    loss_fn = objectives.make_loss_fn(model, chunk_len=chunk_len)
    (loss, sums), grads = jax.jit(jax.value_and_grad(
        lambda q: loss_fn(q, b, None), has_aux=True))(params)
    np.testing.assert_allclose(loss, ref, rtol=1e-6)
    for k in ref_sums:
      np.testing.assert_allclose(sums[k], ref_sums[k], rtol=1e-6, err_msg=k)
    assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
      r = functools.reduce(lambda t, k: t[k.key], path, ref_grads)
      np.testing.assert_allclose(g, r, atol=1e-6, rtol=1e-5,
                                 err_msg=f"{chunk_len} {jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_one_pass_cross_entropy_is_autodiffs_and_argmaxs(dtype):
  """Accelerators' cross-entropy (one reduction for the sum and the argmax,
  a gradient written out; CPUs take autodiff's and sampling.argmax) gives
  the same losses, argmaxes (ties: the first index) and gradients, at every
  vocabulary edge and for a row without loss weight."""
  from jaxtl.objectives import losses  # pylint: disable=import-outside-toplevel
  k = jax.random.split(jax.random.key(0), 3)
  logits = (4 * jax.random.normal(k[0], (3, 7, 50))).astype(dtype)
  logits = logits.at[2, 0].set(1.0)  # a row of ties
  targets = jax.random.randint(k[1], (3, 7), 0, 50).at[0, :2].set(jnp.array([0, 49]))
  g = jax.random.uniform(k[2], (3, 7)).at[1].set(0.0)
  nll, argmax = losses._one_pass(logits, targets)
  np.testing.assert_allclose(nll, losses._nll_fwd(logits, targets)[0], rtol=1e-6)
  np.testing.assert_array_equal(argmax, sampling.argmax(logits.astype(jnp.float32)))
  assert argmax[2, 0] == 0
  loss = lambda nll: lambda z: jnp.sum(nll(z, targets) * g)
  want = jax.grad(loss(lambda z, t: losses._nll_fwd(z, t)[0]))(logits)
  got = jax.grad(loss(lambda z, t: losses._one_pass(z, t)[0]))(logits)
  assert got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             atol=1e-6 if dtype == jnp.float32 else 2**-8)


def test_chunked_cross_entropy_holds_one_chunk_of_logits():
  b, t, d, v = 4, 512, 64, 4096  # float32 logits: 32 MiB at once
  logits_fn = lambda p, h: h @ p["w"].T
  args = ({"w": jax.ShapeDtypeStruct((v, d), jnp.float32)},
          jax.ShapeDtypeStruct((b, t, d), jnp.float32),
          jax.ShapeDtypeStruct((b, t), jnp.int32), jax.ShapeDtypeStruct((b, t), jnp.float32))

  def temp_bytes(chunk_len):
    loss = lambda p, h, y, w: objectives.chunked_cross_entropy(
        logits_fn, p, h, y, w, chunk_len)["loss_sum"]
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

  whole = temp_bytes(0)
  assert whole >= 2 * b * t * v * 4  # logits and their gradient
  # 8 chunks. XLA:CPU frees each chunk's logits before the next; XLA:GPU's
  # scheduler keeps more alive (38 of 71 MB measured on an H100).
  assert temp_bytes(64) < whole / (4 if jax.default_backend() == "cpu" else 1.5)


def test_a_fresh_run_compiles_its_step_once_while_the_state_is_made_and_a_rerun_none(
    tmp_path, caplog):
  import runs  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  config = runs.tiny_mlm_config()
  config.train.update(steps=2, eval_every=0, eval_batches=1)
  config.model.update(mlp_dim=48)  # a step no other test compiles: no cache hit

  def step_compiles() -> list[str]:
    return [r.threadName for r in caplog.records
            if r.getMessage().startswith("Finished XLA compilation of jit(train_step)")]

  jax.config.update("jax_log_compiles", True)  # for every thread, not this one alone
  try:
    with caplog.at_level("WARNING"):
      pretrain.train_and_evaluate(config, str(tmp_path))
      # Compiled ahead, in the background, and found in jit's cache by the first step.
      assert step_compiles() == ["compile_ahead"]
      # A rerun when finished (say with a new learning rate) says that nothing
      # trains, and only evaluates.
      caplog.clear()
      config.optim.lr *= 2
      pretrain.train_and_evaluate(config, str(tmp_path))
      assert f"{tmp_path} was trained to step 2 of 2 already: this run only evaluates" in (
          caplog.text)
      assert not step_compiles()
  finally:
    jax.config.update("jax_log_compiles", False)


def test_a_run_that_fails_before_its_first_step_leaves_no_compile_running(tmp_path,
                                                                         monkeypatch):
  """An error while the state is made (a bad checkpoint, out of memory)
  waits for the step compiling ahead: a process that exits while XLA
  compiles on another thread aborts instead of reporting the error."""
  import threading  # pylint: disable=g-import-not-at-top
  import runs  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  from jaxtl.train import step as step_lib  # pylint: disable=g-import-not-at-top

  def failing_init(*args, **kwargs):
    raise ValueError("no memory for the state")

  monkeypatch.setattr(step_lib, "init_sharded_state", failing_init)
  config = runs.tiny_mlm_config()
  config.train.update(steps=2, eval_every=0, eval_batches=1)
  config.model.update(mlp_dim=40)  # a step no other test compiles: no cache hit
  with pytest.raises(ValueError, match="no memory for the state"):
    pretrain.train_and_evaluate(config, str(tmp_path))
  assert not [t for t in threading.enumerate() if t.name == "compile_ahead"]
