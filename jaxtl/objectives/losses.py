"""Pretraining objectives as loss functions over t5x-style batches.

The host pipeline (:mod:`jaxtl.pretraining.pipeline`) already did the objective's
work on the inputs (MLM masking, causal shifting, span corruption), so every
objective reduces to a weighted token cross-entropy between the model's logits
and ``*_target_tokens``, weighted by ``*_loss_weights``. What differs is which
model family runs and which features feed it:

  mlm  (encoder):          encoder_input_tokens -> encoder_target_tokens
  clm  (decoder):          decoder_input_tokens -> decoder_target_tokens
  span, bart, prefix_lm_encdec (encoder_decoder):
                           encoder_input_tokens + decoder_input_tokens
                           -> decoder_target_tokens
  prefix_lm (decoder):     clm's, plus decoder_causal_attention (the prefix)

A batch with ``sentence_labels`` (NSP / SOP) adds the mean cross-entropy
of the model's sentence head to the token loss.

Losses are returned as *sums* alongside the weight total so that gradient
accumulation and multi-batch evaluation give exactly the full-batch numbers.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtl.decoding import sampling
from jaxtl.models import transformer
from jaxtl.models.config import target_side
from jaxtl.models.family import family_of

Array = jax.Array
Batch = Mapping[str, Array]
LossFn = Callable[..., tuple[Array, dict[str, Array]]]

# Default config.objective.loss_chunk_len: GPT-2's 1024 positions go in 4
# chunks; shorter rows (and MLM's masked positions) in one.
LOSS_CHUNK_LEN = 256


def forward(model: nn.Module, params: Any, batch: Batch, *,
            deterministic: bool = True, rng: Array | None = None,
            **kwargs: Any) -> dict[str, Any]:
  """Runs ``model`` on the features of ``batch`` its family consumes."""
  family = family_of(model.config)
  rngs = None if deterministic or rng is None else {"dropout": rng}
  variables = {"params": params}
  if family.seq2seq:
    return model.apply(
        variables, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch.get("encoder_segment_ids"), batch.get("decoder_segment_ids"),
        batch.get("encoder_positions"), batch.get("decoder_positions"),
        deterministic=deterministic, rngs=rngs, **kwargs)
  p = family.input_side
  if f"{p}_causal_attention" in batch:  # a prefix LM's bidirectional prefix
    kwargs["prefix_BT"] = batch[f"{p}_causal_attention"]
  return model.apply(
      variables, batch[f"{p}_input_tokens"], batch.get(f"{p}_segment_ids"),
      batch.get(f"{p}_positions"), batch.get(f"{p}_token_type_ids"),
      deterministic=deterministic, rngs=rngs, **kwargs)


def _nll_and_argmax(logits_BTV: Array, targets_BT: Array) -> tuple[Array, Array]:
  """([B, T] float32 ``logsumexp(logits) - logits[target]``, [B, T] argmax).

  Differentiated by autodiff on a CPU and by :func:`_one_pass` on
  accelerators. Autodiff keeps ``exp(z - max)`` from the forward pass in
  float32 for the backward: on a CPU, where the exponentials cost more
  than the memory, that is the fast way (the gradient over 256 x 50,304
  logits: 18.1 ms against 30.5 recomputing them, Zen 3 EPYC). On a GPU the
  same kernels are bound by memory, and the float32 copies it writes and
  reads are the cost.
  """
  if jax.default_backend() == "cpu":
    z_BTV = logits_BTV.astype(jnp.float32)
    return _nll_fwd(logits_BTV, targets_BT)[0], sampling.argmax(z_BTV)
  return _one_pass(logits_BTV, targets_BT)


def _nll_fwd(logits_BTV, targets_BT):
  z_BTV = logits_BTV.astype(jnp.float32)
  log_z_BT = jax.nn.logsumexp(z_BTV, axis=-1)
  target_logit_BT = jnp.take_along_axis(z_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return log_z_BT - target_logit_BT, (logits_BTV, targets_BT, log_z_BT)


@jax.custom_vjp
def _one_pass(logits_BTV: Array, targets_BT: Array) -> tuple[Array, Array]:
  return _one_pass_fwd(logits_BTV, targets_BT)[0]


def _one_pass_fwd(logits_BTV, targets_BT):
  """The row's max, then one reduction for the sum of exponentials and the
  first index of the max (``sampling.argmax``) together: as two plain
  reductions XLA:GPU read every chunk of logits once more."""
  z_BTV = logits_BTV.astype(jnp.float32)
  axis, vocab = z_BTV.ndim - 1, z_BTV.shape[-1]
  max_BT = jnp.max(z_BTV, axis=axis)
  shift_BT = jnp.where(jnp.isfinite(max_BT), max_BT, 0)  # as jax.nn.logsumexp
  index_BTV = jax.lax.broadcasted_iota(jnp.int32, z_BTV.shape, axis)
  sum_BT, argmax_BT = jax.lax.reduce(
      (jnp.exp(z_BTV - shift_BT[..., None]),
       jnp.where(z_BTV == max_BT[..., None], index_BTV, vocab - 1)),
      (jnp.float32(0), jnp.int32(vocab - 1)),
      lambda a, b: (a[0] + b[0], jnp.minimum(a[1], b[1])), (axis,))
  log_z_BT = shift_BT + jnp.log(sum_BT)
  target_logit_BT = jnp.take_along_axis(z_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return (log_z_BT - target_logit_BT, argmax_BT), (logits_BTV, targets_BT, log_z_BT)


def _one_pass_bwd(residuals, cotangents):
  """``(softmax(z) - onehot(target)) * g`` in one elementwise pass that
  reads the logits and writes their gradient in the logits' dtype.
  Autodiff's gradient wrote the probabilities in float32, added the
  target's -1 by a scatter and cast them in another pass: for GPT-2 small
  at 16 x 1024 on an H100, 6.6 GB a step more (docs: studies/performance)."""
  logits_BTV, targets_BT, log_z_BT = residuals
  g_BT = cotangents[0]  # the argmax has none
  z_BTV = logits_BTV.astype(jnp.float32)
  vocab_BTV = jax.lax.broadcasted_iota(targets_BT.dtype, logits_BTV.shape, logits_BTV.ndim - 1)
  onehot_BTV = (vocab_BTV == targets_BT[..., None]).astype(jnp.float32)
  d_BTV = (jnp.exp(z_BTV - log_z_BT[..., None]) - onehot_BTV) * g_BT[..., None]
  return d_BTV.astype(logits_BTV.dtype), None


_one_pass.defvjp(_one_pass_fwd, _one_pass_bwd)


def token_cross_entropy(logits_BTV: Array, targets_BT: Array,
                        weights_BT: Array) -> dict[str, Array]:
  """Weighted cross-entropy and accuracy, as sums over the batch (float32).

  Differentiable in ``logits_BTV`` (on accelerators by a gradient written
  out: :func:`_nll_and_argmax`).
  """
  nll_BT, argmax_BT = _nll_and_argmax(logits_BTV, targets_BT)
  weights_BT = weights_BT.astype(jnp.float32)
  return {
      "loss_sum": jnp.sum(nll_BT * weights_BT),
      "correct_sum": jnp.sum((argmax_BT == targets_BT) * weights_BT),
      "weight_sum": jnp.sum(weights_BT),
  }


SENTENCE_LABELS = "sentence_labels"  # [B]: NSP / SOP's batch feature


def sentence_cross_entropy(logits_BC: Array, labels_B: Array) -> dict[str, Array]:
  """The sentence head's cross-entropy and accuracy, as sums (float32)."""
  logits_BC = logits_BC.astype(jnp.float32)
  nll_B = (jax.nn.logsumexp(logits_BC, -1)
           - jnp.take_along_axis(logits_BC, labels_B[:, None], -1)[:, 0])
  return {"sentence_loss_sum": jnp.sum(nll_B),
          "sentence_correct_sum": jnp.sum(jnp.argmax(logits_BC, -1) == labels_B
                                          ).astype(jnp.float32),
          "sentence_weight_sum": jnp.asarray(labels_B.shape[0], jnp.float32)}


def loss_weight_total(batch: Batch, family: str) -> Array | dict[str, Array]:
  """Sum of loss weights: the normaliser of a (possibly accumulated) batch;
  with sentence labels, ``{"tokens": ..., "sentences": ...}``."""
  tokens = jnp.sum(batch[f"{target_side(family)}_loss_weights"].astype(jnp.float32))
  if SENTENCE_LABELS not in batch:
    return tokens
  return {"tokens": tokens,
          "sentences": jnp.asarray(batch[SENTENCE_LABELS].shape[0], jnp.float32)}


def _to_chunks(x_BT: Array, n: int, c: int) -> Array:
  """[B, T, ...] -> [n, B, c, ...], zero-padding T to n * c."""
  pad = [(0, 0), (0, n * c - x_BT.shape[1])] + [(0, 0)] * (x_BT.ndim - 2)
  x = jnp.pad(x_BT, pad).reshape(x_BT.shape[0], n, c, *x_BT.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _from_chunks(x_nBc: Array, length: int) -> Array:
  """[n, B, c, ...] -> [B, length, ...]: the inverse of ``_to_chunks``."""
  x = jnp.moveaxis(x_nBc, 0, 1)
  return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _chunked(logits_fn: Callable, head_params: Any, hidden_BTD: Array,
             targets_BT: Array, weights_BT: Array, chunk_len: int, with_grads: bool):
  """Cross-entropy sums, chunk by chunk along the length axis; with
  ``with_grads`` also d loss_sum / d (head_params, hidden)."""
  length = hidden_BTD.shape[1]
  c = min(chunk_len or length, length)
  n = -(-length // c)
  xs = tuple(_to_chunks(x, n, c) for x in (hidden_BTD, targets_BT, weights_BT))
  zero_sums = {k: jnp.zeros((), jnp.float32)
               for k in ("loss_sum", "correct_sum", "weight_sum")}
  add = lambda a, b: jax.tree.map(jnp.add, a, b)

  def sums_only(carry, chunk):
    h_BcD, t_Bc, w_Bc = chunk
    return add(carry, token_cross_entropy(logits_fn(head_params, h_BcD), t_Bc, w_Bc)), None

  def with_grad(carry, chunk):
    h_BcD, t_Bc, w_Bc = chunk
    logits_BcV, pull = jax.vjp(logits_fn, head_params, h_BcD)
    loss_of = lambda z: (lambda s: (s["loss_sum"], s))(token_cross_entropy(z, t_Bc, w_Bc))
    dlogits_BcV, sums = jax.grad(loss_of, has_aux=True)(logits_BcV)
    dparams, dh_BcD = pull(dlogits_BcV.astype(logits_BcV.dtype))
    return (add(carry[0], sums), add(carry[1], dparams)), dh_BcD

  if not with_grads:
    return jax.lax.scan(sums_only, zero_sums, xs)[0]
  (sums, dparams), dh_nBcD = jax.lax.scan(
      with_grad, (zero_sums, jax.tree.map(jnp.zeros_like, head_params)), xs)
  return sums, dparams, _from_chunks(dh_nBcD, length)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 5))
def chunked_cross_entropy(logits_fn: Callable, head_params: Any, hidden_BTD: Array,
                          targets_BT: Array, weights_BT: Array,
                          chunk_len: int) -> dict[str, Array]:
  """``token_cross_entropy(logits_fn(head_params, hidden_BTD), ...)`` without
  the whole [B, T, V] logits tensor.

  Logits exist ``chunk_len`` positions at a time (0: all at once). The
  gradient of each chunk is taken as soon as its logits are, so the backward
  pass neither keeps nor recomputes them: the vocabulary projection, often the
  biggest activation of a language model (float32 GPT-2 logits of 8 x 1024
  tokens are 1.6 GB), costs one chunk of memory and no extra FLOPs.
  """
  return _chunked(logits_fn, head_params, hidden_BTD, targets_BT, weights_BT,
                  chunk_len, with_grads=False)


def _chunked_fwd(logits_fn, head_params, hidden_BTD, targets_BT, weights_BT, chunk_len):
  sums, dparams, dhidden_BTD = _chunked(logits_fn, head_params, hidden_BTD, targets_BT,
                                        weights_BT, chunk_len, with_grads=True)
  return sums, (dparams, dhidden_BTD)


def _chunked_bwd(logits_fn, chunk_len, residuals, g):  # pylint: disable=unused-argument
  dparams, dhidden_BTD = residuals
  scale = g["loss_sum"]  # only the loss is differentiable; counts are not
  return (jax.tree.map(lambda d: (d * scale).astype(d.dtype), dparams),
          (dhidden_BTD * scale).astype(dhidden_BTD.dtype), None, None)


chunked_cross_entropy.defvjp(_chunked_fwd, _chunked_bwd)


def make_loss_fn(model: nn.Module, max_predictions: int | None = None,
                 chunk_len: int = LOSS_CHUNK_LEN) -> LossFn:
  """``loss_fn(params, batch, rng, normalizer=None) -> (loss, sums)``.

  ``loss`` is the summed token loss divided by ``normalizer`` (default: this
  batch's weight total); passing the full batch's total when the batch is a
  micro-batch makes accumulated gradients equal the full-batch gradient.
  ``rng`` None means deterministic (no dropout).

  ``max_predictions`` (encoder models): at most this many positions per row
  carry loss weight (MLM's masked tokens), so logits are computed only at
  the ``max_predictions`` highest-weighted positions of each row: MLM
  predicts ~15% of tokens, and the vocabulary projection is most of a small
  model's FLOPs. ``chunk_len``: see :func:`chunked_cross_entropy`.
  """
  if chunk_len < 0:
    raise ValueError(f"loss chunk_len (config.objective.loss_chunk_len) must be "
                     f">= 0 (0: all positions at once), got {chunk_len}")
  cfg = model.config
  p = target_side(cfg.family)
  logits_fn = functools.partial(transformer.apply_lm_head, cfg)

  def loss_fn(params: Any, batch: Batch, rng: Array | None,
              normalizer: Array | None = None):
    targets, weights = batch[f"{p}_target_tokens"], batch[f"{p}_loss_weights"]
    out = forward(model, params, batch, deterministic=rng is None, rng=rng,
                  lm_head=False)
    hidden = out["last_hidden"]
    if max_predictions and family_of(cfg).masked_lm:
      _, idx_BK = jax.lax.top_k(weights, max_predictions)
      hidden = jnp.take_along_axis(hidden, idx_BK[..., None], axis=1)
      targets = jnp.take_along_axis(targets, idx_BK, axis=1)
      weights = jnp.take_along_axis(weights, idx_BK, axis=1)
    sums = chunked_cross_entropy(logits_fn, transformer.lm_head_params(cfg, params),
                                 hidden, targets, weights, chunk_len)
    if SENTENCE_LABELS in batch:
      if "sentence_logits" not in out:
        raise ValueError("the batch has sentence labels (NSP / SOP) but the model "
                         "has no sentence head: set config.model.sentence_classes=2")
      sums = {**sums, **sentence_cross_entropy(out["sentence_logits"],
                                               batch[SENTENCE_LABELS])}
    return normalized_loss(sums, normalizer), sums

  return loss_fn


def normalized_loss(sums: Mapping[str, Array],
                    normalizer: Array | Mapping[str, Array] | None) -> Array:
  """loss_sum / normalizer (default: the batch's own weight total), plus the
  mean sentence loss when ``sums`` has one (``normalizer`` is then
  :func:`loss_weight_total`'s dict)."""
  sentences = None
  if isinstance(normalizer, Mapping):
    normalizer, sentences = normalizer["tokens"], normalizer["sentences"]
  if normalizer is None:
    normalizer = sums["weight_sum"]
  loss = sums["loss_sum"] / jnp.maximum(normalizer, 1.0)
  if "sentence_loss_sum" in sums:
    if sentences is None:
      sentences = sums["sentence_weight_sum"]
    loss = loss + sums["sentence_loss_sum"] / jnp.maximum(sentences, 1.0)
  return loss


def summarize(sums: Mapping[str, Any]) -> dict[str, float]:
  """Turns accumulated sums into loss, accuracy, token count and perplexity:
  a language model's metrics. An objective with sums of its own adds their
  metrics in its :attr:`~jaxtl.objectives.base.Objective.summarize`."""
  weight = max(float(sums["weight_sum"]), 1.0)
  loss = float(sums["loss_sum"]) / weight
  out = {
      "loss": loss,
      "accuracy": float(sums["correct_sum"]) / weight,
      "tokens": float(sums["weight_sum"]),
      "perplexity": float(np.exp(min(loss, 50.0))),
  }
  return out


def summarize_sentences(sums: Mapping[str, Any]) -> dict[str, float]:
  """An LM's metrics plus the sentence head's (NSP, SOP): "loss" stays the
  token loss, beside ``sentence_loss`` and ``sentence_accuracy``."""
  pairs = max(float(sums["sentence_weight_sum"]), 1.0)
  return {**summarize(sums),
          "sentence_loss": float(sums["sentence_loss_sum"]) / pairs,
          "sentence_accuracy": float(sums["sentence_correct_sum"]) / pairs}
