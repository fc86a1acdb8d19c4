"""Continuation log-likelihoods: batched and padded == one example at a
time on its own, left truncation, encoder-decoders, few compilations."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from generate_test import BART, DECODER, T5  # the same tiny models the generator's tests use
from jaxtl.eval import scoring
from jaxtl.models import build_model


def _params(cfg):
  tokens = jnp.ones((1, 4), jnp.int32)
  args = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  return build_model(cfg).init(jax.random.key(0), *args)["params"]


# (context, continuation) lengths: a few shapes, so the per-example reference
# compiles a few times only; 19 + 1 and 3 + 4 fall in other buckets than 9 + 2.
SHAPES = ((3, 1), (9, 2), (19, 1), (3, 4), (9, 2), (19, 1))


def _pairs(seed=0, shapes=SHAPES):
  rng = np.random.default_rng(seed)
  return [(rng.integers(1, 61, a).tolist(), rng.integers(1, 61, b).tolist())
          for a, b in shapes]


@functools.lru_cache(maxsize=None)
def _apply(cfg):
  return jax.jit(build_model(cfg).apply)


EOS = 3  # the tokenizer's, which BART's decoder reads first


def _brute_force(cfg, params, context, continuation, max_len=64):
  """One unpadded sequence through the whole model, the full LM head."""
  apply = _apply(cfg)
  if cfg.family == "encoder_decoder":
    dec = np.array([[EOS if cfg.decoder_start == "eos" else 0, *continuation[:-1]]])
    logits = apply({"params": params}, np.array([context[-max_len:]]), dec)["logits"]
    targets, logits = continuation, logits[0]
  else:
    seq = [*context, *continuation][-(max_len + 1):]
    logits = apply({"params": params}, np.array([seq[:-1]]))["logits"][0]
    targets, logits = continuation, logits[-len(continuation):]
  logp = jax.nn.log_softmax(logits)
  total = sum(float(logp[i, t]) for i, t in enumerate(targets))
  greedy = all(int(jnp.argmax(logits[i])) == t for i, t in enumerate(targets))
  return total, greedy


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [DECODER, T5, BART.replace(decoder_start="eos")],
                         ids=["decoder", "t5", "bart"])
def test_batched_equals_each_example_alone(cfg):
  params, pairs = _params(cfg), _pairs()
  logp, greedy = scoring.loglikelihoods(cfg, params, pairs, batch_size=4, eos_id=EOS)
  # Batched and padded (to buckets, and rows) == each alone, unpadded.
  for i, (ctx, cont) in enumerate(pairs):
    want, want_greedy = _brute_force(cfg, params, ctx, cont)
    np.testing.assert_allclose(logp[i], want, atol=1e-4, err_msg=f"request {i}")
    assert greedy[i] == want_greedy


@pytest.mark.slow
def test_greedy_continuations_are_flagged():
  params = _params(DECODER)
  ctx = [5, 9, 2]
  logits = build_model(DECODER).apply({"params": params}, np.array([ctx]))["logits"]
  best = int(jnp.argmax(logits[0, -1]))
  _, greedy = scoring.loglikelihoods(DECODER, params, [(ctx, [best]), (ctx, [(best + 1) % 61])])
  assert greedy.tolist() == [True, False]


def test_long_contexts_are_cut_on_the_left():
  params = _params(DECODER)
  pairs = _pairs(1, ((30, 2), (17, 1), (9, 3)))
  logp, _ = scoring.loglikelihoods(DECODER, params, pairs, max_len=16)
  for i, (ctx, cont) in enumerate(pairs):
    np.testing.assert_allclose(logp[i], _brute_force(DECODER, params, ctx, cont, 16)[0],
                               atol=1e-4)


@pytest.mark.slow
def test_lengths_compile_a_few_buckets_only():
  scoring._score_batch.clear_cache()  # pylint: disable=protected-access
  params = _params(DECODER)
  rng = np.random.default_rng(2)
  pairs = [(rng.integers(1, 61, rng.integers(1, 60)).tolist(), [7]) for _ in range(40)]
  scoring.loglikelihoods(DECODER, params, pairs, batch_size=8)
  # 40 requests of 1..60 tokens: input buckets 16/32/64 x continuation 16.
  assert scoring._score_batch._cache_size() <= 3  # pylint: disable=protected-access
  assert [scoring.bucket(n, 64) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]


def test_bad_requests_are_refused():
  params = _params(DECODER)
  with pytest.raises(ValueError, match="empty context"):
    scoring.loglikelihoods(DECODER, params, [([], [3])])
  with pytest.raises(ValueError, match="empty continuation"):
    scoring.loglikelihoods(DECODER, params, [([3], [])])
  with pytest.raises(ValueError, match="exceeds max_len 8"):
    scoring.loglikelihoods(DECODER, params, [([3], [4] * 9)], max_len=8)
  with pytest.raises(ValueError, match="encoder-only"):
    scoring.loglikelihoods(DECODER.replace(family="encoder"), params, [([3], [4])])
