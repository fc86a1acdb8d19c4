"""Attention: multi-head dot-product attention (self- and cross-, cached
decoding) and how it is computed: cuDNN's or XLA's kernel, or jaxtl's own
einsums (batched row-major dots on a CPU), causal queries in blocks.

Shape letters as in :mod:`jaxtl.models.layers`.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtl.models import dense_dots, paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.dropout import Dropout
from jaxtl.models.layers import constrain, normal_init, without_unit_batch, zeros_init

Array = jax.Array


def attention_impl(cfg: TransformerConfig, dtype: Any) -> str:
  """How attention is computed: ``cfg.attention_impl``, or when that is None,
  cuDNN's flash attention where it applies (a GPU, 16-bit inputs, a head
  dimension of at most 128 and a multiple of 8), jaxtl's own einsums on a
  CPU, else XLA's kernel (``jax.nn.dot_product_attention``).

  JAX's own default (None) is always XLA, which on a GPU materialises the
  [B, H, T, S] scores; choosing cuDNN here is what makes long sequences fit.
  On a CPU XLA's kernel, which maps its einsums over a group axis, adds
  copies that the plain einsums do not: without attention dropout the train
  step ran 2-10% faster with them (T5-small, BERT-base, MiniLM; docs: studies/performance).
  """
  if cfg.attention_impl is not None:
    return cfg.attention_impl
  backend = jax.default_backend()
  if (backend == "gpu" and jnp.dtype(dtype).itemsize == 2
      and cfg.head_dim <= 128 and cfg.head_dim % 8 == 0):
    return "cudnn"
  return "einsum" if backend == "cpu" else "xla"


# From this many tokens, causal self-attention computes its queries in this
# many blocks (:func:`causal_spans`).
CAUSAL_BLOCKS = ((512, 2), (2048, 4))


def causal_spans(length: int) -> list[tuple[int, int]]:
  """The query blocks ``[(start, stop), ...]`` that causal self-attention
  over ``length`` tokens is computed in: blocks of equal size, as many as
  :data:`CAUSAL_BLOCKS` gives for the length.

  No query sees a later key, so a block needs only the keys up to its own
  last query: in two blocks the scores, the softmax and their backward cover
  3 of 4 quarters of the [T, T] square, in four 10 of 16, with the same
  results (keys above the diagonal have weight 0 either way). Flash
  attention skips them on a GPU; the einsums on a CPU computed them all.
  GPT-2 small's bf16 step on a Zen 4 EPYC ran 4% faster at 2 x 512 in two
  blocks, 6% at 1 x 1024 (no faster in four or eight), and at 1 x 2048
  1.47x in two and 1.54x in four. Every block adds ops to compile (the
  layers are unrolled: at 1024, 7.3 s whole, 9.1 in two, 14.0 in four),
  hence few of them.
  """
  n = max([1] + [k for at, k in CAUSAL_BLOCKS if length >= at])
  size = -(-length // n)
  return [(a, min(a + size, length)) for a in range(0, length, size)]


def _heads_first(a_BXHK: Array) -> Array:
  """[B, X, H, K] -> [B, H, X, K], written out (what the batched dots read)."""
  return dense_dots.written_out(jnp.swapaxes(a_BXHK, 1, 2))


def _prefix(a: Array, layout: str, stop: int) -> Array:
  """Keys or values (``layout`` "bshk" or "bhsk") up to key ``stop``."""
  return jax.lax.slice_in_dim(a, 0, stop, axis=layout.index("s"))


def attention_dropout_cost(cfg: TransformerConfig) -> str | None:
  """Why training with ``cfg`` will not use cuDNN's fused attention where it
  could, or None. Attention dropout needs the probabilities, which the fused
  kernel never materialises, so training takes the einsums instead: on an
  H100, BERT-base's step at 16 x 512 ran at 15.5% MFU that way against 28%
  with cuDNN at 64 x 512 (docs: studies/performance). Said once, at the start of a run."""
  if cfg.attention_dropout_rate <= 0 or attention_impl(cfg, cfg.jnp_dtype) != "cudnn":
    return None
  return (f"attention dropout ({cfg.attention_dropout_rate:g}) keeps training off cuDNN's "
          "fused attention (the probabilities must exist to drop them), which costs "
          "about half the step's speed on an H100 at BERT-base's shapes; "
          "--config.model.attention_dropout_rate=0.0 (fine-tuning: "
          "--config.adapt.attention_dropout_rate=0.0) trains on the fused kernel")


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention (self- or cross-).

  Uses ``jax.nn.dot_product_attention`` (XLA's or cuDNN's kernel) or its
  own einsums (:func:`attention_impl`), and the einsums whenever attention
  weights are needed (for attention dropout in training, or when the caller
  asks to see them) and in cached decoding, whose cache keeps heads first.
  ``causal`` (decoder self-attention) lets cuDNN, and the einsums in query
  blocks (:func:`causal_spans`), skip the keys above the diagonal; the mask
  still carries padding and packed segments. With
  ``row_major_dots`` the einsums are :mod:`dense_dots`' batched dots.
  """
  config: TransformerConfig
  deterministic: bool = True
  return_weights: bool = False
  causal: bool = False
  # Autoregressive decoding: keys and values live in the "cache" collection.
  # Self-attention writes this call's at ``cache_index``; cross-attention
  # stores the encoder's once (the call that passes them) and reuses them.
  decode: bool = False
  cross: bool = False

  def _cached(self, k_BSHK: Array | None, v_BSHK: Array | None,
              cache_index: Array | None) -> tuple[Array, Array]:
    """Keys and values through the cache, [B, H, S, K] as the einsums read
    it (a [B, S, H, K] cache was copied whole at every step and layer)."""
    if k_BSHK is None:  # a later cross-attention step: the stored encoder K/V
      return self.get_variable("cache", "key"), self.get_variable("cache", "value")
    k_BHSK, v_BHSK = jnp.swapaxes(k_BSHK, 1, 2), jnp.swapaxes(v_BSHK, 1, 2)
    key = self.variable("cache", "key", jnp.zeros, k_BHSK.shape, k_BHSK.dtype)
    value = self.variable("cache", "value", jnp.zeros, v_BHSK.shape, v_BHSK.dtype)
    if self.is_initializing():
      return k_BHSK, v_BHSK
    if self.cross:
      key.value, value.value = k_BHSK, v_BHSK
    else:
      at = (0, 0, cache_index, 0)
      key.value = jax.lax.dynamic_update_slice(key.value, k_BHSK.astype(key.value.dtype), at)
      value.value = jax.lax.dynamic_update_slice(value.value,
                                                 v_BHSK.astype(value.value.dtype), at)
    return key.value, value.value

  def _project(self, name: str, x: Array, equation: str, shape: tuple[int, ...],
               axes: tuple[str, ...], bias_shape: tuple[int, ...],
               bias_axes: tuple[str, ...]) -> Array:
    """A multi-dimensional dense layer as one einsum (kernel keeps its axes)."""
    cfg = self.config
    kernel = self.param(paths.kernel(name), normal_init(cfg.init_std, axes), shape,
                        cfg.jnp_param_dtype)
    y = (dense_dots.project(x.astype(cfg.jnp_dtype), kernel, len(shape) - len(bias_shape))
         if cfg.row_major_dots
         else jnp.einsum(equation, x, jnp.asarray(kernel, cfg.jnp_dtype)))
    if cfg.lora_rank and name in cfg.lora_targets:
      y += self._lora(name, x, equation, shape, axes)
    if cfg.use_bias:
      bias = self.param(paths.bias(name), zeros_init(bias_axes), bias_shape,
                        cfg.jnp_param_dtype)
      y = (dense_dots.add_bias(y, bias) if cfg.row_major_dots
           else y + jnp.asarray(bias, cfg.jnp_dtype))
    return y

  def _lora(self, name: str, x: Array, equation: str, shape: tuple[int, ...],
            axes: tuple[str, ...]) -> Array:
    """LoRA: a rank-r update (alpha / r) * x A B beside a frozen kernel.

    B starts at zero, so the model starts exactly at the pretrained one.
    """
    cfg = self.config
    ins, out_spec = equation.split("->")
    x_spec, k_spec = ins.split(",")
    n_in = sum(c in x_spec for c in k_spec)  # kernel dims contracted with x
    keep = "".join(c for c in x_spec if c not in k_spec)
    a = self.param(paths.lora_a(name), normal_init(1.0 / cfg.lora_rank, axes[:n_in] + (None,)),
                   shape[:n_in] + (cfg.lora_rank,), cfg.jnp_param_dtype)
    b = self.param(paths.lora_b(name), zeros_init((None,) + axes[n_in:]),
                   (cfg.lora_rank,) + shape[n_in:], cfg.jnp_param_dtype)
    x = Dropout(cfg.lora_dropout)(x, deterministic=self.deterministic)
    h = jnp.einsum(f"{x_spec},{k_spec[:n_in]}r->{keep}r", x,
                   jnp.asarray(a, cfg.jnp_dtype))
    y = jnp.einsum(f"{keep}r,r{k_spec[n_in:]}->{out_spec}", h,
                   jnp.asarray(b, cfg.jnp_dtype))
    return y * (cfg.lora_alpha / cfg.lora_rank)

  def _mix(self, q_BTHK: Array, keys: Array, values: Array, kv: str,
           mask_B1TS: Array | None, bias_BHTS: Array | None, scale: float
           ) -> tuple[Array, Array]:
    """Attention as einsums (or, with ``row_major_dots``, batched dots):
    ``(out [B, T, H, K], weights [B, H, T, S])``; ``kv`` is the layout of
    ``keys`` and ``values`` ("bshk" or "bhsk")."""
    cfg = self.config
    if cfg.row_major_dots:  # batched dots in the form XLA:CPU's fast kernel takes
      logits_BHTS = dense_dots.attention_scores(_heads_first(q_BTHK), keys) * scale
    else:
      logits_BHTS = jnp.einsum(f"bthk,{kv}->bhts", q_BTHK, keys) * scale
    if bias_BHTS is not None:
      logits_BHTS += bias_BHTS
    if mask_B1TS is not None:
      logits_BHTS = jnp.where(mask_B1TS, logits_BHTS, jnp.finfo(logits_BHTS.dtype).min)
    # Differentiated by its own rule, p * (g - sum(g * p)), not through exp,
    # sum and divide as JAX's default (jax_softmax_custom_jvp=False) does: one
    # pass fewer forward and back. Steps on a Zen 4 EPYC, in turns: GPT-2
    # small 1 x 1024 bf16 3,209 -> 3,080 ms, float32 5,382 -> 5,279; T5-small
    # 2 x 512 802 -> 786 (less peak memory); MiniLM and BERT-base unchanged.
    with jax.softmax_custom_jvp(True):
      weights_BHTS = without_unit_batch(jax.nn.softmax)(logits_BHTS.astype(jnp.float32))
    probs_BHTS = Dropout(cfg.attention_dropout_rate)(
        weights_BHTS, deterministic=self.deterministic).astype(cfg.jnp_dtype)
    if cfg.row_major_dots:
      return jnp.swapaxes(dense_dots.attention_mix(
          probs_BHTS, values.astype(cfg.jnp_dtype)), 1, 2), weights_BHTS
    return jnp.einsum(f"bhts,{kv}->bthk", probs_BHTS, values), weights_BHTS

  @nn.compact
  def __call__(self, x_BTD: Array, kv_BSD: Array | None, mask_B1TS: Array | None,
               bias_BHTS: Array | None = None, cache_index: Array | None = None,
               kv_rows: Array | None = None) -> tuple[Array, Array | None]:
    """``kv_BSD`` is None only for cached cross-attention after its first step.

    ``kv_rows`` [N]: query n (``x_BTD``'s row n, here [N, T, D]) reads the
    keys and values of ``kv_BSD``'s row ``kv_rows[n]``. They are projected
    once per row of ``kv_BSD`` and then gathered, so a few queries from
    each row (:func:`jaxtl.models.transformer.at_positions`) cost no more
    key and value projections than the whole rows would.
    """
    cfg = self.config
    hk = (cfg.num_heads, cfg.head_dim)
    q_BTHK = self._project(paths.QUERY, x_BTD, "btd,dhk->bthk", (cfg.d_model, *hk),
                           ("embed", "heads", "kv"), hk, ("heads", "kv"))
    k_BSHK = v_BSHK = None
    if kv_BSD is not None:
      k_BSHK = self._project(paths.KEY, kv_BSD, "bsd,dhk->bshk", (cfg.d_model, *hk),
                             ("embed", "heads", "kv"), hk, ("heads", "kv"))
      v_BSHK = self._project(paths.VALUE, kv_BSD, "bsd,dhk->bshk", (cfg.d_model, *hk),
                             ("embed", "heads", "kv"), hk, ("heads", "kv"))
      if kv_rows is not None:
        k_BSHK, v_BSHK = k_BSHK[kv_rows], v_BSHK[kv_rows]
    keys, values, kv = k_BSHK, v_BSHK, "bshk"  # kv: their layout
    if self.decode:  # a step against the cache, whose layout is heads first
      (keys, values), kv = self._cached(k_BSHK, v_BSHK, cache_index), "bhsk"
    scale = 1.0 / math.sqrt(cfg.head_dim) if cfg.scale_attention else 1.0

    use_dropout = cfg.attention_dropout_rate > 0 and not self.deterministic
    weights_BHTS = None
    impl = attention_impl(cfg, q_BTHK.dtype)
    if kv_rows is not None and impl == "cudnn":
      impl = "xla"  # one query a row: nothing for the fused kernel to tile
    if self.decode or self.return_weights or use_dropout or impl == "einsum":
      if cfg.row_major_dots and kv == "bshk":  # heads first, once for every block
        keys, values, kv = _heads_first(keys), _heads_first(values), "bhsk"
      length = q_BTHK.shape[1]
      if (self.causal and not self.cross and not self.decode and not self.return_weights
          and kv_rows is None and keys.shape[kv.index("s")] == length
          and len(spans := causal_spans(length)) > 1):
        outs = []
        for start, stop in spans:  # a block of queries reads the keys up to its last
          cut = lambda a: None if a is None else a[..., start:stop, :stop]
          outs.append(self._mix(q_BTHK[:, start:stop], _prefix(keys, kv, stop),
                                _prefix(values, kv, stop), kv, cut(mask_B1TS),
                                cut(bias_BHTS), scale)[0])
        out_BTHK = jnp.concatenate(outs, axis=1)
      else:
        out_BTHK, weights_BHTS = self._mix(q_BTHK, keys, values, kv, mask_B1TS,
                                           bias_BHTS, scale)
    else:
      out_BTHK = jax.nn.dot_product_attention(
          q_BTHK, keys, values, bias=bias_BHTS, mask=mask_B1TS, scale=scale,
          is_causal=impl == "cudnn" and self.causal and not self.cross,
          implementation=impl)
    out_BTHK = constrain(out_BTHK, ("activation_batch", "activation_length",
                                    "activation_heads", "activation_kv"))
    out_BTD = self._project(paths.OUT, out_BTHK, "bthk,hkd->btd",
                            (*hk, cfg.d_model), ("heads", "kv", "embed"),
                            (cfg.d_model,), ("embed",))
    return out_BTD, weights_BHTS
