"""ELECTRA: replaced-token detection (Clark et al. 2020).

The host masks rows exactly as for MLM (``mask_rate`` of the tokens,
whole words with ``whole_word``; the recipe shows 85% of them as [MASK]
and keeps the rest, as ELECTRA does). On the device a small generator
predicts the masked tokens, a *sample* from its softmax replaces each (not
the argmax: the discriminator must see plausible mistakes), and the
discriminator labels every real token original or replaced (a sampled
token equal to the original counts as original). The loss is

  generator MLM (mean over masked tokens)
  + rtd_weight * replaced-token detection (mean over real tokens),

with rtd_weight 50 as in the paper. No gradient flows through the
sampling: the generator learns only from its MLM loss, the shared token
table from both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxtl.decoding import sampling
from jaxtl.models import electra as electra_model
from jaxtl.models.config import TransformerConfig
from jaxtl.objectives import losses, mlm
from jaxtl.objectives.base import Objective
from jaxtl.sections import key


@dataclasses.dataclass(frozen=True)
class ElectraConfig(mlm.MaskingConfig):
  """ELECTRA: BERT's masking for the generator, and the two models' balance."""
  generator_scale: float = key(0.25, "the generator's width, heads and MLP as a "
                                     "fraction of the discriminator's")
  generator_layers: int = key(0, "the generator's layers; 0: the discriminator's")
  rtd_weight: float = key(50.0, "weight of the replaced-token-detection loss")

Array = jax.Array


def build_model(config: TransformerConfig, objective: ElectraConfig) -> nn.Module:
  """The pretrainer: ``config`` is the discriminator (what transfers)."""
  return electra_model.ElectraPretrainer(config, electra_model.generator_config(
      config, objective.generator_scale, objective.generator_layers))


def weight_total(batch: losses.Batch, family: str) -> dict[str, Array]:  # pylint: disable=unused-argument
  """The two losses' normalisers: masked tokens, real tokens."""
  return {"mlm": jnp.sum(batch["encoder_loss_weights"].astype(jnp.float32)),
          "rtd": jnp.sum((batch["encoder_segment_ids"] > 0).astype(jnp.float32))}


def _gather(x_BT: Array, at_BK: Array) -> Array:
  return jnp.take_along_axis(x_BT, at_BK, axis=1)


def make_loss_fn(model: nn.Module, max_predictions: int | None,
                 objective: ElectraConfig) -> losses.LossFn:
  """``loss_fn(params, batch, rng, normalizer=None) -> (loss, sums)``.

  ``sums`` has the generator's ``loss_sum``/``correct_sum``/``weight_sum``
  (so "loss" and "accuracy" are its MLM numbers, comparable with an MLM
  run's) and the discriminator's ``rtd_*_sum``; ``normalizer`` is
  :func:`weight_total` of the whole batch (default: this batch's).
  Evaluation (``rng`` None) samples with a fixed key, so it is repeatable.
  """
  rtd_weight = float(objective.rtd_weight)
  if rtd_weight < 0:
    raise ValueError(f"config.objective.rtd_weight must be >= 0, got {rtd_weight}")

  def loss_fn(params: Any, batch: losses.Batch, rng: Array | None,
              normalizer: dict[str, Array] | None = None):
    inputs_BT, targets_BT = batch["encoder_input_tokens"], batch["encoder_target_tokens"]
    weights_BT, seg_BT = batch["encoder_loss_weights"], batch["encoder_segment_ids"]
    features = (seg_BT, batch.get("encoder_positions"), batch.get("encoder_token_type_ids"))
    deterministic = rng is None
    keys = jax.random.split(jax.random.key(0) if rng is None else rng, 3)
    rngs = lambda k: None if deterministic else {"dropout": keys[k]}
    variables = {"params": params}

    # The generator, at the masked positions only (at most max_predictions).
    k = max_predictions or inputs_BT.shape[1]
    _, at_BK = jax.lax.top_k(weights_BT, k)
    w_BK, t_BK = _gather(weights_BT, at_BK), _gather(targets_BT, at_BK)
    logits_BKV = model.apply(variables, inputs_BT, at_BK, *features,
                             deterministic=deterministic, rngs=rngs(0),
                             method=electra_model.ElectraPretrainer.generator_logits)
    sums = losses.token_cross_entropy(logits_BKV, t_BK, w_BK)

    # Its samples replace the masked tokens.
    sampled_BK = sampling.sample(keys[1], jax.lax.stop_gradient(logits_BKV))
    fill_BK = jnp.where(w_BK > 0, sampled_BK.astype(inputs_BT.dtype),
                        _gather(inputs_BT, at_BK))
    rows_B1 = jnp.arange(inputs_BT.shape[0])[:, None]
    corrupted_BT = jnp.asarray(inputs_BT).at[rows_B1, at_BK].set(fill_BK)

    # The discriminator tells, at every real token, which were replaced.
    out = model.apply(variables, corrupted_BT, *features, deterministic=deterministic,
                      rngs=rngs(2), method=electra_model.ElectraPretrainer.discriminate)
    replaced_BT = (corrupted_BT != targets_BT).astype(jnp.float32)
    real_BT = (seg_BT > 0).astype(jnp.float32)
    logits_BT = out["rtd_logits"].astype(jnp.float32)
    sums.update(
        rtd_loss_sum=jnp.sum(optax.sigmoid_binary_cross_entropy(logits_BT, replaced_BT)
                             * real_BT),
        rtd_correct_sum=jnp.sum(((logits_BT > 0) == (replaced_BT > 0)) * real_BT),
        rtd_weight_sum=jnp.sum(real_BT),
        replaced_sum=jnp.sum(replaced_BT * real_BT))
    if normalizer is None:
      normalizer = {"mlm": sums["weight_sum"], "rtd": sums["rtd_weight_sum"]}
    loss = (sums["loss_sum"] / jnp.maximum(normalizer["mlm"], 1.0)
            + rtd_weight * sums["rtd_loss_sum"] / jnp.maximum(normalizer["rtd"], 1.0))
    return loss, sums

  return loss_fn


def summarize(sums: Mapping[str, Any]) -> dict[str, float]:
  """The generator's MLM metrics plus the discriminator's: its detection
  loss and accuracy over real tokens, and the share of them replaced."""
  real = max(float(sums["rtd_weight_sum"]), 1.0)
  return {**losses.summarize(sums),
          "rtd_loss": float(sums["rtd_loss_sum"]) / real,
          "rtd_accuracy": float(sums["rtd_correct_sum"]) / real,
          "replaced": float(sums["replaced_sum"]) / real}


OBJECTIVE = Objective(
    "electra", "encoder", mlm.prepare,
    "ELECTRA: a small MLM generator's samples replace masked tokens; the "
    "discriminator detects them (rtd_weight 50)",
    config=ElectraConfig, build_model=build_model, make_loss_fn=make_loss_fn,
    weight_total=weight_total, summarize=summarize)
