"""Pretraining objectives as loss functions over t5x-style batches.

The host pipeline (:mod:`jaxtl.data.pipeline`) already did the objective's
work on the inputs (MLM masking, causal shifting, span corruption), so every
objective reduces to a weighted token cross-entropy between the model's logits
and ``*_target_tokens``, weighted by ``*_loss_weights``. What differs is which
model family runs and which features feed it:

  mlm  (encoder):          encoder_input_tokens -> encoder_target_tokens
  clm  (decoder):          decoder_input_tokens -> decoder_target_tokens
  span (encoder_decoder):  encoder_input_tokens + decoder_input_tokens
                           -> decoder_target_tokens

Losses are returned as *sums* alongside the weight total so that gradient
accumulation and multi-batch evaluation give exactly the full-batch numbers.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Batch = Mapping[str, Array]
LossFn = Callable[..., tuple[Array, dict[str, Array]]]

OBJECTIVE_FAMILY = {"mlm": "encoder", "clm": "decoder", "span": "encoder_decoder"}


def check_objective(objective: str, family: str) -> None:
  """Fails early, naming both, when an objective is paired with the wrong model."""
  if objective not in OBJECTIVE_FAMILY:
    raise ValueError(f"unknown objective {objective!r}; known: {sorted(OBJECTIVE_FAMILY)}")
  if OBJECTIVE_FAMILY[objective] != family:
    raise ValueError(f"objective {objective!r} needs a {OBJECTIVE_FAMILY[objective]!r} "
                     f"model, but config.model.family is {family!r}")


def target_prefix(family: str) -> str:
  """Which side of the batch carries targets for a model family."""
  return "encoder" if family == "encoder" else "decoder"


def forward(model: nn.Module, params: Any, batch: Batch, *,
            deterministic: bool = True, rng: Array | None = None,
            **kwargs: Any) -> dict[str, Any]:
  """Runs ``model`` on the features of ``batch`` its family consumes."""
  family = model.config.family
  rngs = None if deterministic or rng is None else {"dropout": rng}
  variables = {"params": params}
  if family == "encoder_decoder":
    return model.apply(
        variables, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch.get("encoder_segment_ids"), batch.get("decoder_segment_ids"),
        batch.get("encoder_positions"), batch.get("decoder_positions"),
        deterministic=deterministic, rngs=rngs, **kwargs)
  p = target_prefix(family)
  return model.apply(
      variables, batch[f"{p}_input_tokens"], batch.get(f"{p}_segment_ids"),
      batch.get(f"{p}_positions"), batch.get(f"{p}_token_type_ids"),
      deterministic=deterministic, rngs=rngs, **kwargs)


def token_cross_entropy(logits_BTV: Array, targets_BT: Array,
                        weights_BT: Array) -> dict[str, Array]:
  """Weighted cross-entropy and accuracy, as sums over the batch (float32)."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  target_logit_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None],
                                        axis=-1)[..., 0]
  nll_BT = log_z_BT - target_logit_BT
  weights_BT = weights_BT.astype(jnp.float32)
  correct_BT = (jnp.argmax(logits_BTV, axis=-1) == targets_BT)
  return {
      "loss_sum": jnp.sum(nll_BT * weights_BT),
      "correct_sum": jnp.sum(correct_BT * weights_BT),
      "weight_sum": jnp.sum(weights_BT),
  }


def loss_weight_total(batch: Batch, family: str) -> Array:
  """Sum of loss weights: the normaliser of a (possibly accumulated) batch."""
  return jnp.sum(batch[f"{target_prefix(family)}_loss_weights"].astype(jnp.float32))


def make_loss_fn(model: nn.Module, max_predictions: int | None = None) -> LossFn:
  """``loss_fn(params, batch, rng, normalizer=None) -> (loss, sums)``.

  ``loss`` is the summed token loss divided by ``normalizer`` (default: this
  batch's weight total); passing the full batch's total when the batch is a
  micro-batch makes accumulated gradients equal the full-batch gradient.
  ``rng`` None means deterministic (no dropout).

  ``max_predictions`` (encoder models): at most this many positions per row
  carry loss weight (MLM's masked tokens), so logits are computed only at
  the ``max_predictions`` highest-weighted positions of each row.
  """
  family = model.config.family
  p = target_prefix(family)

  def loss_fn(params: Any, batch: Batch, rng: Array | None,
              normalizer: Array | None = None):
    targets, weights = batch[f"{p}_target_tokens"], batch[f"{p}_loss_weights"]
    extra = {}
    if max_predictions and family == "encoder":
      _, idx_BK = jax.lax.top_k(weights, max_predictions)
      extra["logits_at_BK"] = idx_BK
      targets = jnp.take_along_axis(targets, idx_BK, axis=1)
      weights = jnp.take_along_axis(weights, idx_BK, axis=1)
    out = forward(model, params, batch, deterministic=rng is None, rng=rng,
                  **extra)
    sums = token_cross_entropy(out["logits"], targets, weights)
    return normalized_loss(sums, normalizer), sums

  return loss_fn


def normalized_loss(sums: Mapping[str, Array], normalizer: Array | None) -> Array:
  """loss_sum / normalizer (default: the batch's own weight total)."""
  if normalizer is None:
    normalizer = sums["weight_sum"]
  return sums["loss_sum"] / jnp.maximum(normalizer, 1.0)


def summarize(sums: Mapping[str, Any]) -> dict[str, float]:
  """Turns accumulated sums into loss, accuracy, token count and perplexity."""
  weight = max(float(sums["weight_sum"]), 1.0)
  loss = float(sums["loss_sum"]) / weight
  return {
      "loss": loss,
      "accuracy": float(sums["correct_sum"]) / weight,
      "tokens": float(sums["weight_sum"]),
      "perplexity": float(np.exp(min(loss, 50.0))),
  }
