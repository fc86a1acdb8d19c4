"""jaxtl.tools.hlo_traffic: kernels, bytes and FLOPs read from compiled HLO."""

import jax
import jax.numpy as jnp
import pytest

from jaxtl.tools import hlo_traffic


def compiled_text(fn, *args) -> str:
  return jax.jit(fn).lower(*args).compile().as_text()


def test_a_matmul_counts_its_flops_and_an_elementwise_pass_its_bytes():
  x = jnp.ones((64, 32), jnp.float32)
  w = jnp.ones((32, 48), jnp.float32)
  found = hlo_traffic.kernels(compiled_text(lambda x, w: jnp.tanh(x @ w) * 3.0, x, w))
  matmuls = [k for k in found if k.kind == "matmul"]
  assert sum(k.flops for k in matmuls) == 2 * 64 * 32 * 48
  # Two contracted axes: both count.
  a, b = jnp.ones((8, 4, 16), jnp.float32), jnp.ones((4, 16, 24), jnp.float32)
  pair = hlo_traffic.kernels(compiled_text(
      lambda a, b: jnp.einsum("xij,ijy->xy", a, b), a, b))
  assert sum(k.flops for k in pair if k.kind == "matmul") == 2 * 8 * 4 * 16 * 24
  # Every launch reads and writes at least the result it makes.
  assert all(k.bytes >= hlo_traffic.shape_bytes(k.shape) for k in found)
  assert sum(k.bytes for k in found) >= (64 * 32 + 32 * 48 + 64 * 48) * 4


def test_a_loop_body_counts_once_per_trip():
  def body(c, _):
    return jnp.sin(c) * 2.0 + 1.0, None
  def loop(x, trips):
    return jax.lax.scan(body, x, None, length=trips)[0]
  x = jnp.ones((256, 256), jnp.float32)
  one, five = (hlo_traffic.kernels(compiled_text(lambda x, n=n: loop(x, n), x))
               for n in (1, 5))
  traffic = lambda found: sum(k.bytes * k.count for k in found)
  assert max(k.count for k in five) == 5
  assert traffic(five) > 4 * traffic(one) - 1


# A hand-made module: a fusion that reads a slice of a big buffer, one that
# gathers rows of a widened one, one that updates a buffer in place, a cuBLAS
# matmul, a scatter (in place too) and a cuDNN attention
# call under a causal mask.
MODULE = """
%sliced (p0: f32[1000,64]) -> f32[10,64] {
  %p0 = f32[1000,64]{1,0} parameter(0)
  ROOT %s = f32[10,64]{1,0} slice(%p0), slice={[0:10], [0:64]}
}

%gathered (g0: bf16[1000,64], g1: s32[5,1]) -> f32[5,64] {
  %g0 = bf16[1000,64]{1,0} parameter(0)
  %g1 = s32[5,1]{1,0} parameter(1)
  %wide = f32[1000,64]{1,0} convert(%g0)
  ROOT %g = f32[5,64]{1,0} gather(%wide, %g1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
}

%update (q0: f32[1000,64], q1: f32[10,64], q2: s32[]) -> f32[1000,64] {
  %q0 = f32[1000,64]{1,0} parameter(0)
  %q1 = f32[10,64]{1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[1000,64]{1,0} dynamic-update-slice(%q0, %q1, %q2, %z)
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: f32[1000,64], i: s32[], q: bf16[2,128,4,32], k: bf16[2,128,4,32], j: s32[5,1], v: f32[5,64], b: bf16[1000,64], q2d: bf16[10,32], w2d: bf16[32,64]) -> f32[1000,64] {
  %a = f32[1000,64]{1,0} parameter(0)
  %j = s32[5,1]{1,0} parameter(4)
  %v = f32[5,64]{1,0} parameter(5)
  %sc = f32[1000,64]{1,0} scatter(%a, %j, %v), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %i = s32[] parameter(1)
  %q = bf16[2,128,4,32]{3,2,1,0} parameter(2)
  %k = bf16[2,128,4,32]{3,2,1,0} parameter(3)
  %f = f32[10,64]{1,0} fusion(%a), kind=kLoop, calls=%sliced, metadata={op_name="jit(f)/stack/layer_0/mlp/slice"}
  %b = bf16[1000,64]{1,0} parameter(6)
  %q2d = bf16[10,32]{1,0} parameter(7)
  %w2d = bf16[32,64]{1,0} parameter(8)
  %gt = f32[5,64]{1,0} fusion(%b, %j), kind=kLoop, calls=%gathered
  %mm = (bf16[10,64]{1,0}, s8[1024]{0}) custom-call(%q2d, %w2d), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %att = (bf16[2,4,128,32]{3,1,2,0}, u8[0]{0}) custom-call(%q, %k, %k), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config": {"mask_type": "CAUSAL"}}
  ROOT %u = f32[1000,64]{1,0} fusion(%a, %f, %i), kind=kLoop, calls=%update
}
"""


def test_slices_in_place_updates_and_fused_attention_are_counted_as_they_move():
  found = {k.name: k for k in hlo_traffic.kernels(MODULE)}
  assert found["f"].bytes == 2 * 10 * 64 * 4  # the slice read, the slice written
  assert found["u"].bytes == 10 * 64 * 4 + 4 + 10 * 64 * 4  # update, index; written
  assert found["mm"].kind == "matmul" and found["mm"].flops == 2 * 10 * 32 * 64  # cuBLAS
  assert found["gt"].bytes == 5 * 64 * 2 + 5 * 4 + 5 * 64 * 4  # gathered rows (bf16)
  assert found["sc"].bytes == 5 * 4 + 2 * 5 * 64 * 4  # indices; updates read, written
  assert found["att"].kind == "attention"
  assert found["att"].flops == 4 * 2 * 128 * 4 * 32 * 128 // 2  # causal: half
  assert hlo_traffic.part(found["f"]) == "mlp"
  assert hlo_traffic.part(found["att"]) == "attention (fused)"
  rows = hlo_traffic.by_part(found.values(), hlo_traffic.H100)
  assert rows[-1]["part"] == "**step**" and rows[-1]["kernels"] == "6"


def test_text_that_is_not_a_compiled_module_is_refused():
  with pytest.raises(ValueError, match="ENTRY"):
    hlo_traffic.kernels("not hlo")
