"""Attention masks and T5's relative position encodings.

Shape letters as in :mod:`jaxtl.models.layers`; N relative-position buckets.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtl.models import paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.layers import normal_init

Array = jax.Array


def attention_mask(q_segment_BT: Array, kv_segment_BS: Array,
                   causal: bool = False,
                   q_positions_BT: Array | None = None,
                   kv_positions_BS: Array | None = None,
                   prefix_BT: Array | None = None) -> Array:
  """Boolean mask [B, 1, T, S]: True where query t may attend to key s.

  Segment id 0 marks padding; packed rows carry segment ids 1..k and a token
  only sees tokens of its own segment. With ``causal`` a query also never sees
  a later key; positions (restarting per packed segment) decide "later" when
  given, else the index along the row. ``prefix_BT`` (self-attention of a
  prefix LM; t5x's ``decoder_causal_attention``) marks each segment's prefix,
  whose tokens see one another in both directions; the rest stays causal.
  """
  mask_BTS = ((q_segment_BT[:, :, None] == kv_segment_BS[:, None, :])
              & (kv_segment_BS[:, None, :] > 0))
  if causal:
    if q_positions_BT is None or kv_positions_BS is None:
      t = jnp.arange(q_segment_BT.shape[1])
      s = jnp.arange(kv_segment_BS.shape[1])
      causal_BTS = (t[:, None] >= s[None, :])[None]
    else:
      causal_BTS = q_positions_BT[:, :, None] >= kv_positions_BS[:, None, :]
    if prefix_BT is not None:
      prefix_BT = prefix_BT.astype(bool)
      causal_BTS = causal_BTS | (prefix_BT[:, :, None] & prefix_BT[:, None, :])
    mask_BTS &= causal_BTS
  return mask_BTS[:, None]


def relative_position_buckets(relative_position: Array, bidirectional: bool,
                              num_buckets: int, max_distance: int) -> Array:
  """T5's log-spaced buckets of (key position - query position).

  Small distances get a bucket each; larger ones share logarithmically wider
  buckets up to ``max_distance``. Bidirectional buckets split the range in two
  halves for keys before and after the query.
  """
  bucket = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    bucket += (relative_position > 0).astype(jnp.int32) * num_buckets
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  log_ratio = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
               / math.log(max_distance / max_exact))
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
  """Learned per-head scalar bias from bucketed relative positions (T5).

  Computed once per stack and shared by all its layers, as in T5.
  """
  config: TransformerConfig
  bidirectional: bool

  @nn.compact
  def __call__(self, q_positions_BT: Array, kv_positions_BS: Array) -> Array:
    cfg = self.config
    table_NH = self.param(
        paths.REL_EMBEDDING, normal_init(cfg.init_std, ("relpos_buckets", "heads")),
        (cfg.relative_buckets, cfg.num_heads), cfg.jnp_param_dtype)
    rel_BTS = kv_positions_BS[:, None, :] - q_positions_BT[:, :, None]
    buckets_BTS = relative_position_buckets(
        rel_BTS, self.bidirectional, cfg.relative_buckets,
        cfg.relative_max_distance)
    # A one-hot product, not a gather: the gather's gradient scatter-adds
    # every (row, query, key) into the same 32 or so rows, and those colliding
    # 16-bit atomic adds took 99% of a T5 train step on an H100 (docs:
    # studies/performance). The product's gradient is a matmul.
    buckets_BTSN = jax.nn.one_hot(buckets_BTS, cfg.relative_buckets, dtype=cfg.jnp_dtype)
    return jnp.einsum("btsn,nh->bhts", buckets_BTSN, jnp.asarray(table_NH, cfg.jnp_dtype))
