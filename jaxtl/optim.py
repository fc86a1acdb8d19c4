"""Optimizers: AdamW with warmup + decay, clipping, and weight-decay masks."""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax
from flax import traverse_util

# Parameters named like these are never weight-decayed: decaying norm gains
# and biases pulls them toward zero for no regularisation benefit.
_NO_DECAY_NAMES = ("bias", "scale", "norm")


def make_schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup to ``optim.lr``, then cosine or linear decay.

  Decay ends at ``optim.end_lr_ratio * lr`` on the last training step.
  """
  warmup = int(optim.warmup_steps)
  decay_steps = max(total_steps - warmup, 1)
  end = optim.lr * optim.end_lr_ratio
  warm = optax.linear_schedule(0.0, optim.lr, max(warmup, 1))
  if optim.schedule == "cosine":
    decay = optax.cosine_decay_schedule(optim.lr, decay_steps, alpha=optim.end_lr_ratio)
  elif optim.schedule == "linear":
    decay = optax.linear_schedule(optim.lr, end, decay_steps)
  elif optim.schedule == "constant":
    decay = optax.constant_schedule(optim.lr)
  else:
    raise ValueError(f"config.optim.schedule={optim.schedule!r}; expected "
                     "cosine, linear or constant")
  if warmup == 0:
    return decay
  return optax.join_schedules([warm, decay], [warmup])


def decay_mask(params: Any) -> Any:
  """True for weight matrices and embeddings; False for norms and biases."""
  flat = traverse_util.flatten_dict(params)
  mask = {path: not any(token in part for part in path for token in _NO_DECAY_NAMES)
          for path in flat}
  return traverse_util.unflatten_dict(mask)


def make_optimizer(optim: ml_collections.ConfigDict, total_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW (decoupled weight decay on matrices only) with global-norm clipping."""
  schedule = make_schedule(optim, total_steps)
  parts = []
  if optim.clip_norm and optim.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(optim.clip_norm))
  parts.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                           weight_decay=optim.weight_decay, mask=decay_mask))
  return optax.chain(*parts), schedule


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
