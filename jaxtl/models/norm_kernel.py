"""LayerNorm and RMSNorm as one Pallas kernel each way (``norm_impl=pallas``).

Why: on an H100 the norms and their backward are the largest elementwise
part of a train step after the matmuls and attention (issue 31). XLA
splits a norm's backward into reductions and elementwise passes that each
read the activations again; compiled for an H100, GPT-2 small's norms
moved about 11 tensor passes each (docs: studies/performance, "The step's
memory traffic"). These kernels read a row block once each way: the
forward reads ``x`` and writes the normed rows plus two float32 numbers a
row; the backward reads ``x`` and the incoming gradient and writes ``dx``,
summing the scale's and bias's gradients over its rows as it goes (a
float32 row of partial sums per program, added up by XLA). In a pre-norm
block the residual passes through the kernel as well
(:func:`norm_and_residual`), so the gradient that comes back along it is
added to the norm's in the same backward pass.

The kernels are written for Pallas's Triton back end (GPUs). CPUs run them
through Pallas's interpreter, slowly: that is for tests, which check them
against flax's norms, gradients included. Rows are independent, but a
``pallas_call`` cannot be split over a mesh by XLA, so the kernel runs on
one device; meshes keep ``norm_impl=xla``.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from jax import custom_derivatives
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

Array = jax.Array

# Programs the backward pass aims for (about 8 an H100 multiprocessor, so
# that enough loads are in flight), each looping over up to 16 row blocks:
# more rows a program, fewer partial sums of the scale's gradient to write.
BACKWARD_PROGRAMS = 1024
MAX_BACKWARD_BLOCKS = 16


def launch(d: int) -> tuple[int, int, int]:
  """(width, rows a block, warps a program) for rows of ``d`` values: rows
  padded to a power of 2 (Triton's blocks are), about 4,096 float32 values
  a block, so that a Triton program keeps its block in registers; wide
  rows get more warps."""
  width = pl.next_power_of_2(d)
  return width, max(1, min(32, 4096 // width)), 8 if width >= 4096 else 4


def backward_blocks(rows: int, block_rows: int) -> int:
  """Row blocks each backward program loops over, for ``rows`` rows."""
  return max(1, min(MAX_BACKWARD_BLOCKS, rows // (block_rows * BACKWARD_PROGRAMS)))


def _block(ref: Any, rows: Array, cols: Array) -> tuple[Array, Array]:
  """(mask, float32 values) of the block at ``rows`` x ``cols`` of a 2-D
  ref; what lies past its edges reads as 0."""
  n, d = ref.shape
  mask = (rows < n)[:, None] & (cols < d)[None, :]
  values = plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=mask, other=0.0)
  return mask, values.astype(jnp.float32)


def _vector(ref: Any, cols: Array) -> Array:
  """A [D] parameter as float32, 0 past its end."""
  return plgpu.load(ref.at[cols], mask=cols < ref.shape[0], other=0.0).astype(jnp.float32)


def _normalized(x: Array, mask: Array, mean: Array, rstd: Array) -> Array:
  """``(x - mean) * rstd`` on the block, 0 outside it."""
  return jnp.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)


def _forward_kernel(x_ref, scale_ref, *refs, eps: float, centered: bool,
                    block_rows: int, width: int) -> None:
  """One block of rows: statistics in float32, the normed rows, and the
  mean (0 for RMSNorm) and reciprocal deviation the backward pass reads."""
  bias_ref, (z_ref, mean_ref, rstd_ref) = (refs[0], refs[1:]) if centered else (None, refs)
  d = x_ref.shape[1]
  rows = pl.program_id(0) * block_rows + jnp.arange(block_rows)
  cols = jnp.arange(width)
  mask, x = _block(x_ref, rows, cols)
  mean = x.sum(axis=1) / d if centered else jnp.zeros((block_rows,), jnp.float32)
  x_mean = jnp.where(mask, x - mean[:, None], 0.0)
  rstd = jax.lax.rsqrt((x_mean * x_mean).sum(axis=1) / d + eps)
  z = x_mean * rstd[:, None] * _vector(scale_ref, cols)[None, :]
  if centered:
    z += _vector(bias_ref, cols)[None, :]
  plgpu.store(z_ref.at[rows[:, None], cols[None, :]], z.astype(z_ref.dtype), mask=mask)
  in_rows = rows < x_ref.shape[0]
  plgpu.store(mean_ref.at[rows], mean, mask=in_rows)
  plgpu.store(rstd_ref.at[rows], rstd, mask=in_rows)


def _backward_kernel(x_ref, scale_ref, mean_ref, rstd_ref, dz_ref, *refs, centered: bool,
                     residual: bool, block_rows: int, blocks: int, width: int) -> None:
  """``blocks`` blocks of rows: each row's ``dx`` (plus, with
  ``residual``, the gradient the residual add sent back to ``x``), and this
  program's sums of the scale's (and bias's) gradient over its rows."""
  dres_ref, (dx_ref, *partial_refs) = (refs[0], refs[1:]) if residual else (None, refs)
  n, d = x_ref.shape
  program = pl.program_id(0)
  cols = jnp.arange(width)
  scale = _vector(scale_ref, cols)[None, :]

  def block(i: Array, sums: tuple[Array, Array]) -> tuple[Array, Array]:
    rows = (program * blocks + i) * block_rows + jnp.arange(block_rows)
    mask, x = _block(x_ref, rows, cols)
    _, dz = _block(dz_ref, rows, cols)
    in_rows = rows < n
    mean = plgpu.load(mean_ref.at[rows], mask=in_rows, other=0.0)
    rstd = plgpu.load(rstd_ref.at[rows], mask=in_rows, other=0.0)
    x_hat = _normalized(x, mask, mean, rstd)
    g = dz * scale
    # dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)); RMSNorm has no mean(g).
    dx = g - x_hat * ((g * x_hat).sum(axis=1) / d)[:, None]
    if centered:
      dx -= (g.sum(axis=1) / d)[:, None]
    dx *= rstd[:, None]
    if residual:
      dx += _block(dres_ref, rows, cols)[1]
    plgpu.store(dx_ref.at[rows[:, None], cols[None, :]], dx.astype(dx_ref.dtype), mask=mask)
    return sums[0] + (dz * x_hat).sum(axis=0), sums[1] + dz.sum(axis=0)

  zeros = jnp.zeros((width,), jnp.float32)
  dscale, dbias = jax.lax.fori_loop(0, blocks, block, (zeros, zeros))
  # Partial sums are [programs * D], flat: one program's row starts at program * D.
  for ref, total in zip(partial_refs, (dscale, dbias)):
    plgpu.store(ref.at[program * d + cols], total, mask=cols < d)


def _call(kernel: Any, grid: int, out_shape: list[jax.ShapeDtypeStruct], warps: int,
          interpret: bool, name: str, *args: Array) -> Any:
  """``kernel`` over a 1-D grid of ``grid`` programs, each of ``warps`` warps."""
  return pl.pallas_call(kernel, grid=(grid,), out_shape=out_shape, interpret=interpret,
                        compiler_params=plgpu.CompilerParams(num_warps=warps),
                        name=name)(*args)


def _forward(x: Array, scale: Array, bias: Array | None, eps: float, out_dtype: Any,
             interpret: bool) -> tuple[Array, Array, Array]:
  """(normed rows, mean, reciprocal deviation)."""
  n, d = x.shape
  width, block_rows, warps = launch(d)
  centered = bias is not None
  kernel = functools.partial(_forward_kernel, eps=eps, centered=centered,
                             block_rows=block_rows, width=width)
  stats = jax.ShapeDtypeStruct((n,), jnp.float32)
  return _call(kernel, pl.cdiv(n, block_rows),
               [jax.ShapeDtypeStruct((n, d), out_dtype), stats, stats], warps,
               interpret, "norm_forward", x, scale, *([bias] if centered else []))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _norm(x: Array, scale: Array, bias: Array | None, eps: float, out_dtype: Any,
          interpret: bool) -> tuple[Array, Array]:
  """(normed rows, ``x`` itself): the second is what a pre-norm block adds
  its branch to, so that the gradient coming back along the residual joins
  the norm's inside the backward kernel (XLA would add the two in a pass of
  its own, reading both and writing the sum)."""
  return _forward(x, scale, bias, eps, out_dtype, interpret)[0], x


def _norm_forward(x: Any, scale: Any, bias: Any, eps: float, out_dtype: Any,
                  interpret: bool) -> tuple[tuple[Array, Array], tuple[Array, ...]]:
  # symbolic_zeros: primals arrive wrapped, with whether each is differentiated.
  x, scale, bias = x.value, scale.value, None if bias is None else bias.value
  z, mean, rstd = _forward(x, scale, bias, eps, out_dtype, interpret)
  return (z, x), (x, scale, bias, mean, rstd)


def _norm_backward(eps: float, out_dtype: Any, interpret: bool, saved: tuple[Array, ...],
                   cotangents: tuple[Any, Any]) -> tuple[Array, Array, Array | None]:
  del eps, out_dtype
  x, scale, bias, mean, rstd = saved
  dz, dres = cotangents
  centered = bias is not None
  zero = custom_derivatives.SymbolicZero
  if isinstance(dz, zero):  # the normed rows went unused
    return (jnp.zeros_like(x) if isinstance(dres, zero) else dres, jnp.zeros_like(scale),
            jnp.zeros_like(bias) if centered else None)
  residual = not isinstance(dres, zero)
  n, d = x.shape
  width, block_rows, warps = launch(d)
  blocks = backward_blocks(n, block_rows)
  programs = pl.cdiv(n, block_rows * blocks)
  partial = jax.ShapeDtypeStruct((programs * d,), jnp.float32)
  kernel = functools.partial(_backward_kernel, centered=centered, residual=residual,
                             block_rows=block_rows, blocks=blocks, width=width)
  dx, *partials = _call(kernel, programs,
                        [jax.ShapeDtypeStruct((n, d), x.dtype)] + [partial] * (1 + centered),
                        warps, interpret, "norm_backward", x, scale, mean, rstd, dz,
                        *([dres] if residual else []))
  dscale, *dbias = [p.reshape(programs, d).sum(axis=0) for p in partials]
  return (dx, dscale.astype(scale.dtype),
          dbias[0].astype(bias.dtype) if centered else None)


_norm.defvjp(_norm_forward, _norm_backward, symbolic_zeros=True)


def norm(x: Array, scale: Array, bias: Array | None, *, eps: float, out_dtype: Any,
         interpret: bool | None = None) -> Array:
  """LayerNorm over the last axis of ``x`` (RMSNorm when ``bias`` is None),
  its statistics in float32, answered in ``out_dtype``; differentiable in
  all three arrays. ``interpret``: run Pallas's interpreter (None: on any
  back end but a GPU)."""
  return norm_and_residual(x, scale, bias, eps=eps, out_dtype=out_dtype,
                           interpret=interpret)[0]


def norm_and_residual(x: Array, scale: Array, bias: Array | None, *, eps: float,
                      out_dtype: Any, interpret: bool | None = None) -> tuple[Array, Array]:
  """(:func:`norm` of ``x``, ``x``): a pre-norm block's branch input and
  the residual it adds its branch to, one kernel each way."""
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  *lead, d = x.shape
  z, x_out = _norm(x.reshape(-1, d), scale, bias, eps, jnp.dtype(out_dtype), interpret)
  return z.reshape(*lead, d), x_out.reshape(*lead, d)


class PallasNorm(nn.Module):
  """A norm module with ``nn.LayerNorm``'s (``nn.RMSNorm``'s, when
  ``centered`` is False) parameters, names and logical axes, computed by
  :func:`norm`: checkpoints move between ``norm_impl=xla`` and ``pallas``
  unchanged. With ``residual`` it answers :func:`norm_and_residual`'s pair."""
  epsilon: float
  dtype: Any
  param_dtype: Any
  centered: bool
  scale_init: Any
  bias_init: Any = None
  residual: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array | tuple[Array, Array]:
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
      raise ValueError(f"norm_impl=pallas runs on one device; this mesh has {mesh.size} "
                       "(set --config.model.norm_impl=xla)")
    d = x.shape[-1]
    scale = self.param("scale", self.scale_init, (d,), self.param_dtype)
    bias = self.param("bias", self.bias_init, (d,), self.param_dtype) if self.centered else None
    if jax.default_backend() != "gpu":
      _warn_interpreted(jax.default_backend())
    pair = norm_and_residual(x, scale, bias, eps=self.epsilon, out_dtype=self.dtype)
    return pair if self.residual else pair[0]


@functools.cache
def _warn_interpreted(backend: str) -> None:
  """Says once a process that the kernels run interpreted here."""
  logging.warning("norm_impl=pallas on %s runs Pallas's interpreter, many times slower "
                  "than norm_impl=xla: it is meant for GPUs (and tests)", backend)
