"""Prefix LM: the split and its loss weights, and a decoder whose prefix
attends both ways while the continuation stays causal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl import objectives
from jaxtl.models import TransformerConfig, build_model
from jaxtl.objectives import clm, prefix_lm


def _row(segments):
  """A row of L + 1 tokens packed from segments of the given lengths (0 pads)."""
  seg = np.concatenate([np.full(n, i + 1) for i, n in enumerate(segments)])
  pos = np.concatenate([np.arange(n) for n in segments])
  return {"tokens": (np.arange(len(seg)) + 10).astype(np.int32),
          "segment_ids": seg.astype(np.int32), "positions": pos.astype(np.int32)}


@pytest.mark.parametrize("segments", [[17], [6, 9, 2], [5, 8, 4]])
def test_the_prefix_is_a_random_start_of_each_segment_and_out_of_the_loss(segments):
  rng = np.random.default_rng(0)
  row = _row(segments)
  causal_weights = clm.clm_example(row)["decoder_loss_weights"]
  cuts = set()
  for _ in range(40):
    ex = prefix_lm.prefix_lm_example(row, rng)
    seg, pos = ex["decoder_segment_ids"], ex["decoder_positions"]
    prefix, weights = ex["decoder_causal_attention"], ex["decoder_loss_weights"]
    for s in np.unique(seg[seg > 0]):
      at = seg == s
      p, n = int(prefix[at].sum()), int(at.sum())
      cuts.add(p)
      assert 1 <= p <= max(n - 1, 1)
      np.testing.assert_array_equal(prefix[at], pos[at] < p)  # a start of the segment
      # The loss: causal LM's, from the last prefix position on (it predicts
      # the first continuation token).
      np.testing.assert_array_equal(weights[at], causal_weights[at] * (pos[at] >= p - 1))
  assert len(cuts) > 3  # the split point is random


def _tiny_decoder():
  cfg = TransformerConfig(family="decoder", vocab_size=64, d_model=32, num_heads=4,
                          head_dim=8, mlp_dim=64, num_layers=2, max_len=16,
                          dropout_rate=0.0)
  model = build_model(cfg)
  tokens = jnp.arange(1, 11, dtype=jnp.int32)[None]
  params = model.init(jax.random.key(0), tokens)["params"]
  return model, params, tokens


def test_prefix_attends_both_ways_and_the_continuation_stays_causal():
  model, params, tokens = _tiny_decoder()
  prefix = (jnp.arange(10) < 4).astype(jnp.int32)  # tokens 0..3
  # One batch: (base, token 3 changed, token 6 changed) with the prefix, then
  # (base, token 3 changed) with none (all zeros: plain causal attention).
  rows = jnp.concatenate([tokens, tokens.at[0, 3].set(40), tokens.at[0, 6].set(40),
                          tokens, tokens.at[0, 3].set(40)])
  prefixes = jnp.stack([prefix] * 3 + [jnp.zeros_like(prefix)] * 2)
  apply = jax.jit(lambda r, p: model.apply({"params": params}, r, prefix_BT=p,
                                           lm_head=False)["last_hidden"])
  base, changed, later, causal, causal_changed = np.asarray(apply(rows, prefixes))
  # A later prefix token changes earlier prefix outputs ...
  assert np.abs(changed[0] - base[0]).max() > 1e-4
  # ... but not in a plain causal LM.
  np.testing.assert_allclose(causal_changed[:3], causal[:3], atol=1e-6)
  # A continuation token changes no earlier position, prefix included.
  np.testing.assert_allclose(later[:6], base[:6], atol=1e-6)
  assert np.abs(later[6:] - base[6:]).max() > 1e-4
  # The continuation sees the whole prefix.
  assert np.abs(changed[5] - base[5]).max() > 1e-4


def test_the_loss_sees_the_prefix_only_through_the_prefix_lm_batch():
  model, params, tokens = _tiny_decoder()
  rng = np.random.default_rng(0)
  row = _row([11])
  ex = prefix_lm.prefix_lm_example(row, rng)
  batch = {k: jnp.asarray(v)[None] for k, v in ex.items()}
  loss_fn = objectives.make_loss_fn(model)
  loss, sums = loss_fn(params, batch, None)
  assert float(sums["weight_sum"]) == float(ex["decoder_loss_weights"].sum()) < 10
  causal_batch = {k: v for k, v in batch.items() if k != "decoder_causal_attention"}
  other, _ = loss_fn(params, causal_batch, None)
  assert abs(float(loss) - float(other)) > 1e-6  # the prefix's mask took effect
  with pytest.raises(ValueError, match="decoder_causal_attention"):
    model.apply({"params": params}, tokens, prefix_BT=jnp.ones_like(tokens),
                decode=True, mutable=["cache"])


def test_encoder_decoder_variant_cuts_the_row_into_prefix_and_continuation():
  rng = np.random.default_rng(0)
  row = _row([20])
  cuts = set()
  for _ in range(20):
    ex = prefix_lm.prefix_lm_encdec_example(row, rng, pad_id=0, length=20)
    enc = ex["encoder_input_tokens"][ex["encoder_segment_ids"] > 0]
    dec = ex["decoder_target_tokens"][ex["decoder_loss_weights"] > 0]
    np.testing.assert_array_equal(np.concatenate([enc, dec]), row["tokens"])
    assert len(enc) >= 1 and len(dec) >= 1
    np.testing.assert_array_equal(ex["decoder_input_tokens"][1:],
                                  ex["decoder_target_tokens"][:-1])
    cuts.add(len(enc))
  assert len(cuts) > 5
