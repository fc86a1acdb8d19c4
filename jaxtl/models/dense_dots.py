"""Dense-layer and attention matmuls in the forms XLA:CPU hands to its fast kernels.

XLA:CPU gives a dot to YNNPACK (which on an Intel Xeon with AMX runs bf16
on AMX tiles) by its form. Autodiff's backward dots are transposed forms
(``g @ w.T`` for the input's gradient, ``x.T @ g`` for the weights'), and
XLA folds those transposes into the dot's dimension numbers. On the AVX2
EPYC, ``x.T @ g`` then runs on Eigen instead (float32 and bf16 alike); on
issue 34's Sapphire Rapids both backward forms ran at 234-268 GFLOP/s in
bf16 against 1,492-1,601 with the transposed operand materialised, and a
bf16 forward reached 1,858-1,940 only when it accumulated in float32 (274
with a bf16 result). On a Zen 4 EPYC (AVX512-BF16) XLA widens any other
bf16 dot to float32, and this form makes a dense layer's forward and
backward 1.8x float32's (531 against 297 GFLOP/s); on an Emerald Rapids
Xeon (AMX) 2.7x (691 against 258). That is why bfloat16 turns it on
there, chosen by ``auto`` or by name
(:func:`jaxtl.runtime.xla_cpu.row_major_dots`).

:func:`dense_dot` is ``x @ w`` with its own backward: both backward dots get
their transposed operand materialised first, pinned row-major so that
XLA cannot fold it back (:func:`written_out`), and every dot accumulates in
float32. A transpose moves ``M x K`` numbers for a dot of ``M x K x N``
multiply-adds. In float32 only ``w.T`` (weight-sized) is written out and
the weights' gradient ``x.T @ g`` is left to XLA, which lays it out itself:
on the AMX Xeon the float32 MiniLM step took 1,056 ms that way against
1,218 with both transposes written out and 1,143 with plain einsums (32 x
64; at 32 x 16: 287, 311 and 340), fastest in 6 of 6 alternated rounds.
On a Zen 3 or Zen 4 EPYC, whose YNNPACK takes ``g @ w.T`` as it is, even
``w.T`` is left to XLA (:func:`jaxtl.runtime.xla_cpu.folds_float32_dx`):
280.2 against 292.6 ms at 10 x 48 on the Zen 3, 195.0 against 199.9 on
the Zen 4, and 188.5 against 202.9 on an AMX Xeon that reports family 6
model 167 (480 MiB of L3).
``launch/cpu_dots.py`` shows which form reaches which kernel on the CPU it
runs on.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.layout import Layout, with_layout_constraint

from jaxtl.runtime import xla_cpu

Array = jax.Array

_ROW_MAJOR = (((1,), (0,)), ((), ()))  # [M, K] x [K, N]
_LHS_TRANSPOSED = (((0,), (0,)), ((), ()))  # [K, M] x [K, N]: a.T @ b
_RHS_TRANSPOSED = (((1,), (1,)), ((), ()))  # [M, N] x [K, N]: a @ b.T


def _dot(a: Array, b: Array, out_dtype: Any, dims: Any = _ROW_MAJOR) -> Array:
  return lax.dot_general(a, b, dims,
                         preferred_element_type=jnp.float32).astype(out_dtype)


def written_out(a: Array) -> Array:
  """``a`` (typically a transpose) as an array of its own, not a dot's
  dimension numbers.

  Its layout is pinned row-major, so XLA must write the numbers out in
  that order: it can neither fold a transpose back into the consuming dot
  nor make it a column-major layout of the same buffer (which on a Zen 4
  EPYC sends a bf16 dot back to float32). Written so, a transpose is a
  fusion whose root is the copy, which XLA:CPU emits about three times
  faster than the flattened optimization barrier used before (a bf16
  384 x 1,536 weight: 0.15 against 0.44 ms on the AMX Xeon).
  """
  return with_layout_constraint(a, Layout(major_to_minor=tuple(range(a.ndim))))


def materialised_t(a: Array) -> Array:
  """``a`` with its last two axes swapped (``a.T`` of a matrix), written
  out (:func:`written_out`)."""
  return written_out(jnp.swapaxes(a, -1, -2))


@jax.custom_vjp
def dense_dot(x: Array, w: Array) -> Array:
  """``x @ w`` for ``x [..., K]`` and ``w [K, N]``, in ``x``'s dtype, with
  float32 accumulation and a backward made of row-major dots.

  ``w`` may be wider than ``x`` (float32 parameters of a bf16 layer): it
  is cast here, and its gradient comes back in its own dtype, summed in
  float32 and never rounded to bf16 on the way."""
  return _dot(x.reshape(-1, x.shape[-1]), w.astype(x.dtype),
              x.dtype).reshape(*x.shape[:-1], w.shape[1])


def _fwd(x: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
  return dense_dot(x, w), (x, w)


def _bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  x, w = res
  x_MK = x.reshape(-1, x.shape[-1])
  g_MN = g.reshape(-1, g.shape[-1]).astype(x.dtype)
  return (_dot_t(g_MN, w.astype(x.dtype), x.dtype).reshape(x.shape),
          _t_dot(x_MK, g_MN, w.dtype))


dense_dot.defvjp(_fwd, _bwd)


def _dot_t(a: Array, b: Array, out_dtype: Any, min_rows: int = 0) -> Array:
  """``a @ b.T`` for ``a [M, K]`` and ``b [N, K]``: ``b.T`` written out,
  except where XLA's folded form pays (float32 on a CPU of
  :func:`jaxtl.runtime.xla_cpu.folds_float32_dx`; fewer rows than
  ``min_rows``, too few to pay for writing ``b.T``)."""
  if a.shape[0] < min_rows or (
      a.dtype == jnp.float32 and xla_cpu.folds_float32_dx(jax.default_backend())):
    return _dot(a, b, out_dtype, _RHS_TRANSPOSED)
  return _dot(a, materialised_t(b), out_dtype)


def _t_dot(a: Array, b: Array, out_dtype: Any) -> Array:
  """``a.T @ b`` for ``a [M, K]`` and ``b [M, N]`` (a weight's gradient):
  ``a.T`` written out in bf16; in float32, XLA's own ``a.T @ b``, which it
  lays out itself (see the module's docstring)."""
  if a.dtype == jnp.float32:
    return _dot(a, b, out_dtype, _LHS_TRANSPOSED)
  return _dot(materialised_t(a), b, out_dtype)


# Rows below which :func:`dense_dot_t` leaves ``w.T`` to XLA: writing out a
# [N, K] table's transpose for a handful of rows (a decoding step) costs
# more than the dot it speeds up.
MIN_ROWS_TO_WRITE_T = 64


@jax.custom_vjp
def dense_dot_t(x: Array, w: Array) -> Array:
  """``x @ w.T`` for ``x [..., K]`` and ``w [N, K]``, as :func:`dense_dot`
  (``x``'s dtype, float32 accumulation, row-major dots): a tied LM head's
  logits against the token table.

  ``nn.Embed.attend``'s bf16 ``x @ w.T`` has a bf16 result and a
  transposed operand, so XLA:CPU widened both to float32: GPT-2 small's
  head ran at 164-192 GFLOP/s, a quarter of its bf16 step on a Zen 4 EPYC.
  Here ``w.T`` is written out in bf16 where there are rows enough, and
  the table's gradient comes back [N, K] as ``g.T @ x``. In float32 the
  forward is the form of :func:`dense_dot`'s input gradient, and takes the
  same rule."""
  y = _dot_t(x.reshape(-1, x.shape[-1]), w.astype(x.dtype), x.dtype, MIN_ROWS_TO_WRITE_T)
  return y.reshape(*x.shape[:-1], w.shape[0])


def _t_fwd(x: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
  return dense_dot_t(x, w), (x, w)


def _t_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  x, w = res
  g_MN = g.reshape(-1, g.shape[-1]).astype(x.dtype)
  return (_dot(g_MN, w.astype(x.dtype), x.dtype).reshape(x.shape),
          _t_dot(g_MN, x.reshape(-1, x.shape[-1]), w.dtype))


dense_dot_t.defvjp(_t_fwd, _t_bwd)


# ----------------------------------------------------------------------------
# Attention's batched dots: [..., T, K] x [..., S, K] (scores) and
# [..., T, S] x [..., S, K] (mixing the values), batched over the leading
# (batch, head) axes, the two forms XLA:CPU gives YNNPACK in bf16 when they
# accumulate in float32. A bf16 einsum with a bf16 result is widened to
# float32 (about 50 GFLOP/s on a Zen 4 EPYC at MiniLM's 384 heads of
# 64 x 32 against 130), and autodiff's ``p.T @ g`` form runs on Eigen (21).


def _batched(a: Array, b: Array, b_transposed: bool, out_dtype: Any) -> Array:
  """``a @ b`` (or ``a @ b.T``) over the last two axes, batched over the rest."""
  batch = tuple(range(a.ndim - 2))
  dims = (((a.ndim - 1,), (b.ndim - 1 if b_transposed else b.ndim - 2,)), (batch, batch))
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(out_dtype)


@jax.custom_vjp
def attention_scores(q: Array, k: Array) -> Array:
  """``q @ k.T`` for ``q [..., T, K]`` and ``k [..., S, K]``: float32
  scores ``[..., T, S]`` from (bf16) operands, backward in the fast forms."""
  return _batched(q, k, True, jnp.float32)


def _scores_fwd(q: Array, k: Array) -> tuple[Array, tuple[Array, Array]]:
  return attention_scores(q, k), (q, k)


def _scores_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  q, k = res
  g = g.astype(q.dtype)
  return (_batched(g, k, False, q.dtype),
          _batched(materialised_t(g), q, False, k.dtype))


attention_scores.defvjp(_scores_fwd, _scores_bwd)


@jax.custom_vjp
def attention_mix(p: Array, v: Array) -> Array:
  """``p @ v`` for weights ``p [..., T, S]`` and values ``v [..., S, K]``,
  in ``v``'s dtype, with float32 accumulation and fast backward forms."""
  return _batched(p, v, False, v.dtype)


def _mix_fwd(p: Array, v: Array) -> tuple[Array, tuple[Array, Array]]:
  return attention_mix(p, v), (p, v)


def _mix_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  p, v = res
  g = written_out(g.astype(v.dtype))  # arrives transposed from [B, T, H, K]
  return (_batched(g, v, True, p.dtype),
          _batched(materialised_t(p), g, False, v.dtype))


attention_mix.defvjp(_mix_fwd, _mix_bwd)


@jax.custom_vjp
def add_bias(y: Array, bias: Array) -> Array:
  """``y + bias`` (``bias`` over ``y``'s last axes, cast to ``y``'s dtype)
  whose bias gradient sums in float32.

  Autodiff sums a bf16 ``y``'s gradient over the batch in bf16, and XLA:CPU
  turns that sum into a slow reduce-window: 12 ms for one MiniLM MLP bias
  at 32 x 64 on a Zen 4 EPYC, 160 ms of a bf16 step's 1,035 ms of ops,
  against about 0.2 ms for a float32 sum."""
  return y + bias.astype(y.dtype)


def _bias_fwd(y: Array, bias: Array) -> tuple[Array, Array]:
  return add_bias(y, bias), bias


def _bias_bwd(bias: Array, g: Array) -> tuple[Array, Array]:
  batch = tuple(range(g.ndim - bias.ndim))
  return g, jnp.sum(g.astype(jnp.float32), axis=batch).astype(bias.dtype)


add_bias.defvjp(_bias_fwd, _bias_bwd)


def project(x: Array, kernel: Array, n_in: int) -> Array:
  """A multi-dimensional dense layer (``btd,dhk->bthk``, ``bthk,hkd->btd``)
  as one :func:`dense_dot`: ``x``'s last ``n_in`` axes contract with
  ``kernel``'s first ``n_in``."""
  lead, out = x.shape[:x.ndim - n_in], kernel.shape[n_in:]
  y = dense_dot(x.reshape(*lead, -1), kernel.reshape(-1, math.prod(out)))
  return y.reshape(*lead, *out)


class RowMajorDense(nn.Dense):
  """``nn.Dense`` (the same parameters) as one :func:`dense_dot`, its bias
  added by :func:`add_bias` (``row_major_dots``)."""

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features),
                        self.param_dtype)
    y = dense_dot(inputs.astype(self.dtype), kernel)
    if not self.use_bias:
      return y
    return add_bias(y, self.param("bias", self.bias_init, (self.features,),
                                  self.param_dtype))
