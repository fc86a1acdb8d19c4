"""ELECTRA: the pretrainer's tree and sharing, sampled replacements, which
positions carry each loss, gradients, and what transfers."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from jaxtl import objectives
from jaxtl.models import TransformerConfig, build_model, electra, paths

OBJECTIVE = types.SimpleNamespace(generator_scale=0.25, generator_layers=1,
                                  rtd_weight=50.0, loss_chunk_len=0)
MASK = 3


def tiny(**kw):
  return TransformerConfig(**{**dict(
      family="encoder", vocab_size=64, d_model=32, num_heads=4, head_dim=8, mlp_dim=64,
      num_layers=1, max_len=16, dropout_rate=0.0, pre_norm=False, embed_norm=True,
      lm_head_transform=True, lm_head_bias=True), **kw})


def batch(seed=0, b=4, length=12):
  rng = np.random.default_rng(seed)
  targets = rng.integers(4, 64, (b, length)).astype(np.int32)
  seg = np.ones((b, length), np.int32)
  seg[:, -3:] = 0  # padding
  weights = np.zeros((b, length), np.float32)
  weights[:, [1, 4, 6]] = 1.0
  inputs = np.where(weights > 0, MASK, targets).astype(np.int32)
  return {"encoder_input_tokens": inputs, "encoder_target_tokens": targets,
          "encoder_loss_weights": weights, "encoder_segment_ids": seg,
          "encoder_positions": np.broadcast_to(np.arange(length), (b, length))}


@pytest.fixture(scope="module")
def setup():
  obj = objectives.get("electra")
  model = obj.build_model(tiny(), OBJECTIVE)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0),
                                        jnp.ones((1, 12), jnp.int32)))["params"]
  return obj, model, params, jax.jit(obj.make_loss_fn(model, 4, OBJECTIVE))


@pytest.mark.slow
def test_generator_is_smaller_and_shares_the_token_table(setup):
  _, model, params, _ = setup
  g = model.generator_config
  assert (g.d_model, g.num_heads, g.mlp_dim, g.num_layers) == (8, 1, 16, 1)
  flat = traverse_util.flatten_dict(params, sep="/")
  assert [k for k in flat if k.endswith("/" + paths.EMBEDDING)] == [paths.TOKEN_TABLE]
  # The generator embeds at the table's width and projects down to its own.
  embedder = paths.join(paths.GENERATOR, paths.STACK, paths.EMBEDDER)
  assert flat[paths.join(embedder, paths.EMBED_PROJECT, paths.KERNEL)].shape == (32, 8)
  assert flat[paths.join(embedder, paths.POSITION_EMBEDDING)].shape == (16, 32)
  with pytest.raises(ValueError, match="generator_scale"):
    electra.generator_config(tiny(), 0.0)


@pytest.mark.parametrize("preset,scale,heads,head_dim", [
    ("bert_tiny", 0.25, 1, 32),   # narrower than a head: one head as wide as itself
    ("bert_tiny", 0.5, 1, 64),
    ("bert_base", 1 / 3, 4, 64),  # the paper's ELECTRA-Base generator
])
def test_generator_heads_fill_its_width(preset, scale, heads, head_dim):
  # Hugging Face's ElectraForMaskedLM can only hold heads x head width = width.
  from jaxtl.configs import models
  gen = electra.generator_config(TransformerConfig.from_mapping(models.PRESETS[preset]), scale)
  assert (gen.num_heads, gen.head_dim) == (heads, head_dim)
  assert gen.num_heads * gen.head_dim == gen.d_model


@pytest.mark.slow  # `setup` compiles: 8 s
def test_the_discriminator_is_an_encoders_tree(setup):
  _, _, params, _ = setup
  disc, rest = electra.discriminator(params)
  encoder = nn.unbox(jax.eval_shape(build_model(tiny()).init, jax.random.key(1),
                                    jnp.ones((1, 12), jnp.int32)))["params"]
  del encoder[paths.LM_HEAD]
  assert jax.tree.map(jnp.shape, disc) == jax.tree.map(jnp.shape, encoder)
  assert sorted(rest) == sorted(electra.PRETRAINING_ONLY)


def test_a_table_narrower_than_the_discriminator():
  """ELECTRA-Small's shape: a [V, 16] table under a width-32 discriminator
  and a width-8 generator, each projecting from it; the discriminator is
  still an encoder's tree (embed_dim=16). (tests/pretrain_test.py trains it.)"""
  cfg = tiny(embed_dim=16)
  model = objectives.get("electra").build_model(cfg, OBJECTIVE)
  params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                   jnp.ones((1, 12), jnp.int32)))["params"]
  flat = traverse_util.flatten_dict(params, sep="/")
  project = lambda *stack: paths.join(*stack, paths.STACK, paths.EMBEDDER,
                                      paths.EMBED_PROJECT, paths.KERNEL)
  assert flat[paths.TOKEN_TABLE].shape == (64, 16)
  assert flat[project()].shape == (16, 32)
  assert flat[project(paths.GENERATOR)].shape == (16, 8)
  assert flat[paths.join(paths.GENERATOR, paths.LM_HEAD, paths.TRANSFORM,
                         paths.KERNEL)].shape == (8, 16)
  disc, _ = electra.discriminator(params)
  encoder = nn.unbox(jax.eval_shape(build_model(cfg).init, jax.random.key(1),
                                    jnp.ones((1, 12), jnp.int32)))["params"]
  del encoder[paths.LM_HEAD]
  assert jax.tree.map(jnp.shape, disc) == jax.tree.map(jnp.shape, encoder)


@pytest.mark.slow
def test_replacements_are_sampled_at_masked_positions_only(setup):
  _, model, params, loss_fn = setup
  b = batch()
  seen = []
  for seed in range(4):
    _, sums = loss_fn(params, b, jax.random.key(seed))
    seen.append(float(sums["replaced_sum"]))
  # A random generator almost never samples the original token: nearly all
  # 12 masked tokens are replaced, and only they (9 real tokens per row).
  assert all(9 <= r <= 12 for r in seen)
  _, sums = loss_fn(params, b, None)
  assert float(sums["rtd_weight_sum"]) == 4 * 9 and float(sums["weight_sum"]) == 12
  # Samples, not the argmax: different keys replace with different tokens.
  logits = jax.jit(lambda p, t, at: model.apply({"params": p}, t, at,
                                                method=model.generator_logits))(
      params, b["encoder_input_tokens"], jnp.array([[1, 4, 6, 0]] * 4))
  draws = {tuple(np.asarray(jax.random.categorical(jax.random.key(s), logits)).ravel())
           for s in range(3)}
  assert len(draws) == 3


@pytest.mark.slow
def test_loss_is_mlm_plus_weighted_detection_and_rtd_skips_the_generator(setup):
  obj, model, params, loss_fn = setup
  b = batch(1)
  loss, sums = loss_fn(params, b, jax.random.key(0))
  expected = (sums["loss_sum"] / sums["weight_sum"]
              + 50.0 * sums["rtd_loss_sum"] / sums["rtd_weight_sum"])
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  # Without the MLM term, nothing reaches the generator's own weights (the
  # samples are discrete); the shared table still learns from detection.
  rtd_only = types.SimpleNamespace(**{**vars(OBJECTIVE), "rtd_weight": 1.0})
  fn = obj.make_loss_fn(model, 4, rtd_only)
  grads = jax.jit(jax.grad(lambda p: fn(p, b, jax.random.key(0))[1]["rtd_loss_sum"]))(
      params)
  gen = jax.tree.leaves(grads[paths.GENERATOR])
  assert all(float(jnp.abs(g).max()) == 0.0 for g in gen)
  assert float(jnp.abs(grads[paths.TOKEN_EMBED]["embedding"]).max()) > 0


def test_stages_cannot_switch_between_mlm_and_electra():
  from jaxtl.pretraining import pretrain  # pylint: disable=import-outside-toplevel
  pretrain.check_same_model(objectives.get("mlm"), objectives.get("span"))  # same module
  with pytest.raises(ValueError, match="trains another model than the run's 'electra'"):
    pretrain.check_same_model(objectives.get("mlm"), objectives.get("electra"))


@pytest.mark.slow  # `setup` compiles: 8 s
def test_flops_count_the_discriminator_and_the_generator_as_if_alone(setup):
  # ELECTRA's step is a generator (an MLM encoder, LM head at the masked
  # positions) plus a discriminator (an encoder and a per-token head).
  from jaxtl.train import perf
  _, model, params, _ = setup
  t, k = 12, 4
  shapes = lambda cfg: nn.unbox(jax.eval_shape(
      build_model(cfg).init, jax.random.key(0), jnp.ones((1, t), jnp.int32)))["params"]
  gen_cfg = model.generator_config
  generator = perf.flops_per_example(gen_cfg, shapes(gen_cfg), t, head_positions=k)
  d = tiny().d_model
  discriminator = (perf.flops_per_example(tiny(), shapes(tiny()), t, head_positions=0)
                   + 6 * d * d * t)  # its head's dense layer (the logit column aside)
  got = perf.flops_per_example(tiny(), params, t, head_positions=k, generator=gen_cfg)
  assert got == pytest.approx(generator + discriminator)
