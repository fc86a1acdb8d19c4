"""Transformer building blocks: embeddings, MLP, norms, adapters, LoRA
(attention: :mod:`jaxtl.models.attention`; masks and relative positions:
:mod:`jaxtl.models.masks`; dropout: :mod:`jaxtl.models.dropout`).

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

from jaxtl.models import dense_dots, norm_kernel, paths
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


_TANH_GELU_C = math.sqrt(2 / math.pi)
_TANH_GELU_A = 0.044715  # the cubic term's weight


@jax.custom_jvp
def gelu_tanh(x: Array) -> Array:
  """``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, GPT-2's GELU
  (``jax.nn.gelu(approximate=True)``), with a derivative of its own.

  Autodiff's derivative reuses the forward's tanh, so XLA:GPU writes that
  tanh out in float32 for the backward pass, next to the bf16 activation:
  twice the bytes of the activation itself. This derivative computes its
  own from ``x`` (by ``exp``, not ``tanh``), and XLA recomputes it inside
  the backward kernel instead, as it does for the exact GELU: GPT-2 small's
  MLP traffic at 16 x 1024 on an H100 11.5 -> 6.7 GB a step
  (``launch/gpu_traffic.py``). CPUs, bound by arithmetic rather than
  memory, keep autodiff's (:func:`activation_fn`).
  """
  return 0.5 * x * (1 + jnp.tanh(_TANH_GELU_C * (x + _TANH_GELU_A * x**3)))


@gelu_tanh.defjvp
def _gelu_tanh_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
  x, = primals
  u = _TANH_GELU_C * (x + _TANH_GELU_A * x**3)
  e = jnp.exp(-2 * jnp.abs(u))  # in (0, 1]: tanh and sech^2 of u without overflow
  tanh_u = jnp.sign(u) * (1 - e) / (1 + e)
  sech2_u = 4 * e / (1 + e) ** 2
  du = _TANH_GELU_C * (1 + 3 * _TANH_GELU_A * x * x)
  return gelu_tanh(x), (0.5 * (1 + tanh_u) + 0.5 * x * sech2_u * du) * tangents[0]


def _in_float32(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
  """``fn`` computed in float32 and rounded once to its input's dtype.

  XLA:CPU evaluates bf16 transcendentals by widening every op, converts
  and all: the GELUs' forward and backward in a bf16 MiniLM step took
  about 9% of it on a Zen 4 EPYC that way (docs: studies/performance).
  On GPUs the widening is free inside the fused kernel, as long as no
  float32 intermediate is kept for the backward pass (:func:`gelu_tanh`)."""
  return lambda x: fn(x.astype(jnp.float32)).astype(x.dtype)


def _gelu_new(x: Array) -> Array:
  """GPT-2's GELU, differentiated as suits the backend: on a CPU autodiff's
  derivative, which reuses the forward's tanh, is the cheaper (over
  [1024, 3072] float32, forward and backward 2.46 ms against 3.93 with
  :func:`gelu_tanh`'s, 40 rounds in turns, Zen 3); elsewhere
  :func:`gelu_tanh`'s."""
  if jax.default_backend() == "cpu":
    return nn.gelu(x, approximate=True)
  return gelu_tanh(x)


def activation_fn(name: str) -> Callable[[Array], Array]:
  """The MLP non-linearity by name (HF names: gelu is exact, gelu_new is tanh)."""
  table = {
      "gelu": _in_float32(gelu_exact),
      "gelu_new": _in_float32(_gelu_new),
      "relu": nn.relu,
      "silu": _in_float32(nn.silu),
  }
  if name not in table:
    raise ValueError(f"unknown activation {name!r}; known: {sorted(table)}")
  return table[name]


# ----------------------------------------------------------------------------
# Layers.


def make_norm(cfg: TransformerConfig, name: str, residual: bool = False) -> Callable[..., Any]:
  """LayerNorm (BERT, GPT-2) or RMSNorm without bias (T5), per the config
  (see :func:`without_unit_batch`); ``norm_impl=pallas``: the same norm as
  one Pallas kernel each way (:mod:`jaxtl.models.norm_kernel`).

  ``residual``: the callable answers ``(norm(x), x)``, the second for a
  pre-norm block's residual add; the Pallas kernels then add the gradient
  that comes back along the residual to the norm's in the same pass."""
  if cfg.norm_impl == "pallas":
    return norm_kernel.PallasNorm(
        epsilon=cfg.norm_eps, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype,
        centered=cfg.norm == "layernorm", scale_init=ones_init(("embed",)),
        bias_init=zeros_init(("embed",)), residual=residual, name=name)
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
  apply = without_unit_batch(norm)
  return (lambda x: (apply(x), x)) if residual else apply


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
