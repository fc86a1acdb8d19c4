"""Transformer building blocks: embeddings, attention, MLP, norms (masks and
relative positions: :mod:`jaxtl.models.masks`; dropout:
:mod:`jaxtl.models.dropout`).

Shape letters used in names (nanodo style):
  B batch, T query length, S key/value length, D model width, H heads,
  K head width, F MLP width, V vocabulary, N relative-position buckets,
  E token-table width (``embed_width``: D unless ``embed_dim`` is set).

Every parameter carries logical axis names (t5x vocabulary: ``vocab, embed,
mlp, heads, kv``) so that one rules table in :mod:`jaxtl.train.sharding` decides how
it is laid out on a device mesh; layers never mention mesh axes.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from jaxtl.models import dense_dots, paths
from jaxtl.models.dropout import Dropout
from jaxtl.models.config import TransformerConfig

Array = jax.Array

# Logical names for activations at block boundaries (kept apart from parameter
# names so that, e.g., FSDP can shard the `embed` axis of weights while leaving
# activations sharded over the batch only).
ACT_BLD = ("activation_batch", "activation_length", "activation_embed")


def constrain(x: Array, axes: tuple[str | None, ...]) -> Array:
  """Logical sharding constraint (a no-op outside a mesh context)."""
  return nn.with_logical_constraint(x, axes)


def normal_init(std: float, axes: tuple[str, ...]) -> Callable[..., Any]:
  """N(0, std) initialiser whose parameter carries logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=std), axes)


def zeros_init(axes: tuple[str, ...]) -> Callable[..., Any]:
  """Zeros (biases), with logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def ones_init(axes: tuple[str, ...]) -> Callable[..., Any]:
  """Ones (norm scales), with logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def dense(cfg: TransformerConfig, features: int, axes: tuple[str, str], name: str,
          dtype: Any, use_bias: bool = True) -> nn.Dense:
  """A dense layer with the config's initialisers and matmul form, its
  parameters named by logical ``axes`` (MLP, LM head, heads' pooler /
  transform and output layers)."""
  return (dense_dots.RowMajorDense if cfg.row_major_dots else nn.Dense)(
      features, use_bias=use_bias, dtype=dtype, param_dtype=cfg.jnp_param_dtype,
      kernel_init=normal_init(cfg.init_std, axes), bias_init=zeros_init(axes[1:]),
      name=name)


def gelu_exact(x: Array) -> Array:
  """x Phi(x), the exact GELU (BERT's, PyTorch's ``gelu``), as
  ``x / 2 (1 + erf(x / sqrt 2))``: erf is a single rational polynomial,
  where ``jax.nn.gelu(approximate=False)``'s erfc takes exponentials and
  branches. Within 1e-6 of it in float32."""
  return x * (0.5 + 0.5 * jax.lax.erf(x * math.sqrt(0.5)))


def _in_float32(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
  """``fn`` computed in float32 and rounded once to its input's dtype.

  XLA:CPU evaluates bf16 transcendentals by widening every op, converts
  and all: the GELUs' forward and backward in a bf16 MiniLM step took
  about 9% of it on a Zen 4 EPYC that way (docs: studies/performance).
  On GPUs the widening is free inside the fused kernel either way."""
  return lambda x: fn(x.astype(jnp.float32)).astype(x.dtype)


def activation_fn(name: str) -> Callable[[Array], Array]:
  """The MLP non-linearity by name (HF names: gelu is exact, gelu_new is tanh)."""
  table = {
      "gelu": _in_float32(gelu_exact),
      "gelu_new": _in_float32(lambda x: nn.gelu(x, approximate=True)),
      "relu": nn.relu,
      "silu": _in_float32(nn.silu),
  }
  if name not in table:
    raise ValueError(f"unknown activation {name!r}; known: {sorted(table)}")
  return table[name]


# ----------------------------------------------------------------------------
# Layers.


def make_norm(cfg: TransformerConfig, name: str) -> Callable[[Array], Array]:
  """LayerNorm (BERT, GPT-2) or RMSNorm without bias (T5), per the config
  (see :func:`without_unit_batch`)."""
  if cfg.norm == "rmsnorm":
    norm = nn.RMSNorm(epsilon=cfg.norm_eps, dtype=cfg.jnp_dtype,
                      param_dtype=cfg.jnp_param_dtype,
                      scale_init=ones_init(("embed",)), name=name)
  elif cfg.norm == "layernorm":
    norm = nn.LayerNorm(epsilon=cfg.norm_eps, dtype=cfg.jnp_dtype,
                        param_dtype=cfg.jnp_param_dtype,
                        scale_init=ones_init(("embed",)),
                        bias_init=zeros_init(("embed",)), name=name)
  else:
    raise ValueError(f"unknown norm {cfg.norm!r}; known: layernorm, rmsnorm")
  return without_unit_batch(norm)


def without_unit_batch(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
  """``fn`` that, given a batch of one row, runs on the row alone (``x[0]``)
  and puts the batch axis back.

  XLA:CPU gives reductions to YNNPACK, which runs the reduction of a product
  over an array whose leading axis has size 1 at a tenth of its usual speed:
  ``sum(a * b, -1)`` over [1, 12, 512, 1024] float32 took 17.9 ms against 1.3
  over [12, 512, 1024] (Zen 4 EPYC). A norm's and a softmax's backward are
  made of such reductions, so a batch of one row (the CPU benchmarks, a
  micro-batch of one) ran slowly: GPT-2 small's bf16 step at 1 x 1024 ran 5%
  faster without the unit axis, T5-small's at 1 x 512 8%; larger batches
  do not change.
  """
  def apply(x: Array) -> Array:
    return fn(x[0])[None] if x.ndim > 1 and x.shape[0] == 1 else fn(x)
  return apply


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
  ``causal`` (decoder self-attention) lets cuDNN skip the blocks above the
  diagonal; the mask still carries padding and packed segments. With
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


class Adapter(nn.Module):
  """Houlsby adapter: x + up(act(down(x))), a bottleneck of ``adapter_dim``.

  ``up`` starts at zero, so inserting adapters leaves a pretrained model's
  outputs unchanged until they train.
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BTD: Array) -> Array:
    cfg = self.config
    h = nn.Dense(cfg.adapter_dim, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype,
                 kernel_init=normal_init(cfg.init_std, ("embed", "mlp")),
                 bias_init=zeros_init(("mlp",)), name=paths.ADAPTER_DOWN)(x_BTD)
    h = activation_fn(cfg.activation)(h)
    return x_BTD + nn.Dense(cfg.d_model, dtype=cfg.jnp_dtype,
                            param_dtype=cfg.jnp_param_dtype,
                            kernel_init=zeros_init(("mlp", "embed")),
                            bias_init=zeros_init(("embed",)), name=paths.ADAPTER_UP)(h)


def without_lora(config: TransformerConfig, params: Any) -> tuple[TransformerConfig, Any]:
  """(config, params) with any LoRA update folded into its kernel: the same
  function, with ``lora_rank=0`` and no LoRA parameters (for export, or for
  a later scheme that would otherwise drop what LoRA learned)."""
  if not config.lora_rank:
    return config, params
  return config.replace(lora_rank=0), merge_lora(params, config)


def merge_lora(params: Any, config: TransformerConfig) -> Any:
  """Folds every LoRA update into its kernel (for inference).

  The result has no ``*_lora_*`` parameters and runs on a model built with
  ``lora_rank=0``, computing the same function with no extra cost.
  """
  flat = traverse_util.flatten_dict(params, sep="/")
  out = {k: v for k, v in flat.items() if not re.search(paths.LORA_RE, k)}
  scale = config.lora_alpha / max(config.lora_rank, 1)
  for key, a in flat.items():
    projection = paths.lora_projection(key)
    if projection is None:
      continue
    b, name = flat[paths.lora_b(projection)], paths.kernel(projection)
    kernel = out[name]
    # Scanned layers carry a leading layer axis on a, b and the kernel.
    stacked = kernel.ndim == a.ndim + b.ndim - 3
    rank = a.shape[-1]
    a3 = a.reshape(a.shape[0] if stacked else 1, -1, rank)  # [L, in, r]
    b3 = b.reshape(a3.shape[0], rank, -1)  # [L, r, out]
    delta = scale * jnp.einsum("lir,lro->lio", a3, b3)
    out[name] = kernel + delta.reshape(kernel.shape).astype(kernel.dtype)
  return traverse_util.unflatten_dict(out, sep="/")


class Mlp(nn.Module):
  """Position-wise feed-forward: act(x W_in) W_out, or gated act(x W_0) * (x W_1)."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BTD: Array) -> Array:
    cfg = self.config
    layer = functools.partial(dense, cfg, dtype=cfg.jnp_dtype, use_bias=cfg.use_bias)
    act = activation_fn(cfg.activation)
    if cfg.gated_mlp:
      h_BTF = (act(layer(cfg.mlp_dim, ("embed", "mlp"), paths.WI_0)(x_BTD))
               * layer(cfg.mlp_dim, ("embed", "mlp"), paths.WI_1)(x_BTD))
    else:
      h_BTF = act(layer(cfg.mlp_dim, ("embed", "mlp"), paths.WI)(x_BTD))
    h_BTF = constrain(h_BTF, ("activation_batch", "activation_length",
                              "activation_mlp"))
    return layer(cfg.d_model, ("mlp", "embed"), paths.WO)(h_BTF)


class Embedder(nn.Module):
  """Token (+ learned absolute position) (+ token type) embeddings.

  The token table is owned by the caller so that T5 can share one table
  between encoder, decoder and LM head. With ``embed_dim`` (E) the whole
  block, its norm included, runs at E and one dense layer then projects
  to d_model, as ELECTRA's ``embeddings_project`` does; a narrower ELECTRA
  generator reads the shared [V, E] table the same way.
  """
  config: TransformerConfig
  token_embed: nn.Module
  deterministic: bool = True

  @nn.compact
  def __call__(self, tokens_BT: Array, positions_BT: Array,
               token_types_BT: Array | None = None) -> Array:
    cfg, e = self.config, self.config.embed_width
    # Both tables gathered in the parameters' dtype, then cast: a bf16 step
    # then casts the rows it reads, not the whole [V, E] table, and the
    # gradient is a float32 scatter-add (native atomics on GPUs).
    x_BTE = jnp.take(self.token_embed.embedding, tokens_BT, axis=0).astype(cfg.jnp_dtype)
    if cfg.position == "learned":
      table_PE = self.param(paths.POSITION_EMBEDDING,
                            normal_init(cfg.init_std, ("positions", "embed")),
                            (cfg.max_len, e), cfg.jnp_param_dtype)
      x_BTE += jnp.asarray(table_PE)[positions_BT].astype(cfg.jnp_dtype)
    if cfg.type_vocab_size:
      if token_types_BT is None:
        token_types_BT = jnp.zeros_like(tokens_BT)
      table_YE = self.param(paths.TOKEN_TYPE_EMBEDDING,
                            normal_init(cfg.init_std, ("type_vocab", "embed")),
                            (cfg.type_vocab_size, e), cfg.jnp_param_dtype)
      # A one-hot product, not a gather: the gather's gradient scatters every
      # token into the same two or so rows, and those colliding atomic adds
      # took 60% of BERT-base's step on an H100 (docs: studies/performance).
      types_BTY = jax.nn.one_hot(token_types_BT, cfg.type_vocab_size, dtype=cfg.jnp_dtype)
      x_BTE += jnp.einsum("bty,ye->bte", types_BTY, jnp.asarray(table_YE, cfg.jnp_dtype))
    if cfg.embed_norm:
      x_BTE = make_norm(cfg, paths.EMBED_NORM)(x_BTE)
    x_BTD = Dropout(cfg.dropout_rate)(x_BTE, deterministic=self.deterministic)
    if e != cfg.d_model:
      x_BTD = dense(cfg, cfg.d_model, ("mlp", "embed"), paths.EMBED_PROJECT,
                    cfg.jnp_dtype)(x_BTD)
    return constrain(x_BTD, ACT_BLD)


def token_embedding(cfg: TransformerConfig, name: str = paths.TOKEN_EMBED) -> nn.Embed:
  """The [V, E] token table (E: ``cfg.embed_width``)."""
  return nn.Embed(cfg.vocab_size, cfg.embed_width, dtype=cfg.jnp_dtype,
                  param_dtype=cfg.jnp_param_dtype,
                  embedding_init=normal_init(cfg.init_std, ("vocab", "embed")),
                  name=name)


class LMHead(nn.Module):
  """Projects hidden states to vocabulary logits.

  Tied heads reuse the token table (T5 v1.0 first scales by d_model**-0.5);
  BERT adds a dense + activation + norm transform and an output bias. The
  transform maps to the table's width E (``embed_width``), so a table
  narrower than the model is read back as ELECTRA's generator head does.
  """
  config: TransformerConfig
  token_embed: nn.Module | None = None

  @nn.compact
  def __call__(self, x_BTD: Array) -> Array:
    cfg = self.config
    if cfg.lm_head_transform:
      x_BTD = dense(cfg, cfg.embed_width, ("embed", "mlp"), paths.TRANSFORM,
                    cfg.jnp_dtype)(x_BTD)  # [B, T, E]
      x_BTD = make_norm(cfg, paths.TRANSFORM_NORM)(activation_fn(cfg.activation)(x_BTD))
    if cfg.tie_embeddings:
      if cfg.scale_tied_logits:
        x_BTD = x_BTD * cfg.d_model**-0.5
      logits_BTV = (dense_dots.dense_dot_t(x_BTD.astype(cfg.jnp_dtype),
                                           self.token_embed.embedding)
                    if cfg.row_major_dots else self.token_embed.attend(x_BTD))
    else:
      logits_BTV = dense(cfg, cfg.vocab_size, ("embed", "vocab"), paths.LOGITS,
                         cfg.jnp_dtype, use_bias=False)(x_BTD)
    if cfg.lm_head_bias:
      logits_BTV += self.param(paths.BIAS, zeros_init(("vocab",)), (cfg.vocab_size,),
                               cfg.jnp_param_dtype)
    return constrain(logits_BTV, ("activation_batch", "activation_length",
                                  "activation_vocab"))
