"""Task heads: pooling, every kind on every family, scalar mix, span decoding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.models import TransformerConfig, build_model
from jaxtl.models import heads

BASE = dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, mlp_dim=32,
            num_layers=2, max_len=16, dropout_rate=0.0)
FAMILIES = {
    "encoder": dict(family="encoder", type_vocab_size=2, pre_norm=False,
                    embed_norm=True),
    "decoder": dict(family="decoder"),
    "encoder_decoder": dict(family="encoder_decoder", position="relative",
                            norm="rmsnorm", use_bias=False),
}


def test_pooling():
  h = jnp.arange(2 * 4 * 1, dtype=jnp.float32).reshape(2, 4, 1)
  seg = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]])
  np.testing.assert_allclose(heads.pool(h, seg, "first")[:, 0], [0, 4])
  np.testing.assert_allclose(heads.pool(h, seg, "last")[:, 0], [2, 7])
  np.testing.assert_allclose(heads.pool(h, seg, "mean")[:, 0], [1, 5.5])
  with pytest.raises(ValueError, match="pooling"):
    heads.pool(h, seg, "max")


def test_concat_pooling_is_last_max_mean_over_real_tokens_only():
  h_BTD = jax.random.normal(jax.random.key(0), (2, 5, 3))
  seg_BT = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  got_B3D = heads.pool(h_BTD, seg_BT, "concat")
  assert got_B3D.shape == (2, 9)
  parts = [heads.pool(h_BTD, seg_BT, m) for m in ("last", "mean")]
  np.testing.assert_allclose(got_B3D[:, :3], parts[0], rtol=1e-6)
  np.testing.assert_allclose(got_B3D[:, 6:], parts[1], rtol=1e-6)
  np.testing.assert_allclose(got_B3D[0, 3:6], h_BTD[0, :3].max(0), rtol=1e-6)
  # Padding invariance: huge values in the padding change nothing (max included).
  padded_BTD = h_BTD.at[0, 3:].set(1e6)
  np.testing.assert_allclose(heads.pool(padded_BTD, seg_BT, "concat"), got_B3D,
                             rtol=1e-6)
  # A row of padding only (eval's filler rows) pools to finite values.
  assert np.isfinite(heads.pool(h_BTD, jnp.zeros_like(seg_BT), "concat")).all()


@pytest.mark.slow
def test_concat_pooling_head_reads_three_times_d_model():
  cfg = TransformerConfig(**BASE, **FAMILIES["decoder"])
  model = heads.TaskModel(cfg, num_labels=3, pooling="concat")
  params = model.init(jax.random.key(0), jnp.ones((2, 6), jnp.int32))["params"]
  assert nn.unbox(params)["head"]["out"]["kernel"].shape == (3 * BASE["d_model"], 3)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("kind,shape", [("classification", (2, 3)),
                                        ("regression", (2,)),
                                        ("token_classification", (2, 6, 3)),
                                        ("span_qa", (2, 6, 2))])
def test_every_head_on_every_family(family, kind, shape):
  cfg = TransformerConfig(**BASE, **FAMILIES[family])
  model = heads.TaskModel(cfg, kind=kind, num_labels=3,
                          pooling="last" if family == "decoder" else "first")
  toks = jnp.ones((2, 6), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), toks))["params"]
  assert model.apply({"params": params}, toks).shape == shape
  # The backbone's parameters are exactly the pretraining model's, minus
  # the LM head: a pretraining checkpoint maps straight in.
  lm = build_model(cfg)
  lm_args = (toks, toks) if family == "encoder_decoder" else (toks,)
  lm_params = nn.unbox(jax.eval_shape(lm.init, jax.random.key(0), *lm_args))["params"]
  backbone = jax.tree_util.tree_flatten_with_path(params["backbone"])[0]
  pretrained = dict(jax.tree_util.tree_flatten_with_path(lm_params)[0])
  for path, leaf in backbone:
    assert pretrained[path].shape == leaf.shape
  if family == "encoder_decoder":  # only the encoder (and shared table) is used
    assert "decoder" not in params["backbone"]


@pytest.mark.slow
def test_scalar_mix_starts_uniform_and_learns():
  cfg = TransformerConfig(**BASE, **FAMILIES["encoder"])
  model = heads.TaskModel(cfg, kind="classification", num_labels=2,
                          scalar_mix=True)
  toks = jax.random.randint(jax.random.key(1), (4, 6), 1, 64)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), toks))["params"]
  np.testing.assert_allclose(params["scalar_mix"]["weights"], 0.0)
  labels = jnp.array([0, 1, 0, 1])

  def loss(p):
    logits = model.apply({"params": p}, toks)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

  grads = jax.jit(jax.grad(loss))(params)  # one program: op by op compiled 274
  assert np.abs(np.asarray(grads["scalar_mix"]["weights"])).sum() > 0
  assert np.abs(np.asarray(grads["scalar_mix"]["gamma"])) > 0


def test_best_spans_respects_order_length_and_context():
  start = jnp.array([[0.0, 5.0, 1.0, 9.0, 0.0]])
  end = jnp.array([[8.0, 0.0, 4.0, 0.0, 2.0]])
  context = jnp.array([[False, True, True, True, True]])
  # Best unconstrained pair (0, 0) is outside the context; (3, 0) is reversed.
  s, e, score = heads.best_spans(start, end, context, max_answer_length=3)
  assert (int(s[0]), int(e[0])) == (3, 4)  # 9 + 2 = 11 > 5 + 4 = 9
  assert float(score[0]) == 11.0
  s, e, _ = heads.best_spans(start, end, context, max_answer_length=1)
  assert (int(s[0]), int(e[0])) == (3, 3)  # 9 + 0 beats 1 + 4 and 5 + 0


@pytest.mark.slow
def test_text_to_text_scores_each_label_text_with_the_lm():
  cfg = TransformerConfig(**BASE, **FAMILIES["encoder_decoder"])
  labels = ((5, 7, 1), (9, 1, 0))  # two label texts + EOS (1), padded with 0
  model = heads.TaskModel(cfg, kind="text_to_text", num_labels=2, label_tokens=labels)
  toks = jax.random.randint(jax.random.key(1), (3, 6), 2, 64)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), toks))["params"]
  # No new parameters: the whole T5 (decoder and LM head too) is reused.
  assert set(params) == {"backbone"}
  lm = build_model(cfg)
  lm_params = nn.unbox(jax.jit(lm.init)(jax.random.key(0), toks, toks))["params"]
  assert (jax.tree.map(jnp.shape, params["backbone"]) == jax.tree.map(jnp.shape, lm_params))
  scores = jax.jit(model.apply)({"params": params}, toks)
  assert scores.shape == (3, 2)
  for c, label in enumerate(labels):  # teacher-forced log-likelihood, label by label
    target = np.array([t for t in label if t])
    dec_in = jnp.asarray(np.concatenate([[0], target[:-1]]))[None].repeat(3, 0)
    logits = jax.jit(lm.apply)({"params": params["backbone"]}, toks, dec_in)["logits"]
    ll = jax.nn.log_softmax(logits)[:, np.arange(len(target)), target].sum(-1)
    np.testing.assert_allclose(scores[:, c], ll, rtol=1e-5, atol=1e-5)


def test_text_to_text_needs_an_encoder_decoder():
  cfg = TransformerConfig(**BASE, **FAMILIES["decoder"])
  model = heads.TaskModel(cfg, kind="text_to_text", label_tokens=((5, 1),))
  with pytest.raises(ValueError, match="encoder-decoder"):
    model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))
