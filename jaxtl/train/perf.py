"""Model FLOPs and MFU: how much of the hardware a training step uses.

Model FLOPs per example follow the PaLM appendix convention: 6 FLOPs per
matmul weight per token for forward + backward (2 forward, 4 backward), plus
attention's score and value products, 12 * layers * (heads * head_dim) *
key_length per token (causal masking is not discounted). Embedding lookups
are free; the LM head (the vocab x d_model projection, tied or not, and
BERT's transform) counts at the positions it runs: every target position,
or only the masked ones for MLM.
"""

from __future__ import annotations

import platform
from typing import Any

import jax
from flax import traverse_util

from jaxtl.runtime import xla_cpu
from jaxtl.models import paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.family import family_of

# Dense peak FLOP/s per chip by `device_kind` substring and compute dtype.
# float32 on GPUs means TF32 tensor-core peak, which XLA uses by default.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float32": 494e12},
    "H100": {"bfloat16": 989e12, "float32": 494e12},
    "A100": {"bfloat16": 312e12, "float32": 156e12},
    "L4": {"bfloat16": 121e12, "float32": 60e12},
    "TPU v6": {"bfloat16": 918e12, "float32": 918e12},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12},
    "TPU v5": {"bfloat16": 197e12, "float32": 197e12},  # v5e ("TPU v5 lite").
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12},
}


# The ISA extensions that decide XLA:CPU's and PyTorch's matmul speed.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_model(cpuinfo: str = xla_cpu.CPUINFO) -> str:
  """The CPU as results should name it: model name, vendor, generation and
  the matmul ISA extensions present, e.g. ``AMD EPYC (AuthenticAMD family 25
  model 17; avx2 avx512f avx512_bf16)``.

  The same command runs at different speeds relative to PyTorch on AMD and
  Intel CPUs, and on two generations a cloud names alike (``AMD EPYC``), so
  every CPU figure carries this.
  """
  cpu = xla_cpu.read_cpu(cpuinfo)
  if cpu is None:
    return platform.processor() or platform.machine()
  present = (" ".join(x for x in CPU_FEATURES if x in cpu.flags)
             or "none of " + "/".join(CPU_FEATURES))
  maker = " ".join(filter(None, (cpu.vendor or "unknown vendor", cpu.generation)))
  return f"{cpu.name or platform.machine()} ({maker}; {present})"


def peak_flops_per_device(device: jax.Device | None = None,
                          dtype: str = "bfloat16") -> float | None:
  """Peak dense FLOP/s of one device, or None when unknown (e.g. CPUs)."""
  device = device or jax.devices()[0]
  kind = getattr(device, "device_kind", "")
  for key, table in PEAK_FLOPS.items():
    if key in kind:
      return table.get(dtype, table["bfloat16"])
  return None


def _matmul_params(params: Any, prefix: str | None = None) -> int:
  """Weights of dense layers (``kernel``, ``query_kernel``, ...) below the
  LM head, optionally under one top-level name."""
  flat = traverse_util.flatten_dict(params)
  return sum(int(v.size) for k, v in flat.items()
             if k[-1].endswith(paths.KERNEL) and paths.LOGITS not in k
             and paths.LM_HEAD not in k
             and (prefix is None or prefix in k))


def _head_params(cfg: TransformerConfig, params: Any) -> int:
  """The LM head's weights: the vocabulary projection (tied or not) and
  BERT's transform before it."""
  flat = traverse_util.flatten_dict(params)
  transform = sum(int(v.size) for k, v in flat.items()
                  if k[-1].endswith(paths.KERNEL) and paths.LM_HEAD in k
                  and paths.LOGITS not in k)
  return cfg.vocab_size * cfg.embed_width + transform


def flops_per_example(cfg: TransformerConfig, params: Any,
                      encoder_length: int, decoder_length: int = 0,
                      head_positions: int | None = None,
                      generator: TransformerConfig | None = None,
                      pooled: bool = False) -> float:
  """Training FLOPs for one example (row) of the given lengths.

  ``head_positions``: the LM head runs only at this many positions (MLM);
  None: at every target position; 0: nowhere (a task head replaces it).
  ``pooled``: a task head reads one token of a layer-by-layer (not
  scanned) stack, whose last layer then runs its queries, output and MLP
  at that token alone (:class:`jaxtl.models.transformer.Stack`'s
  ``outputs_at``); its keys and values still cover every position.
  ``generator``: ELECTRA's generator, an encoder over the same rows. Its
  dense weights (under ``generator/``) and LM head are already in
  ``params``; its attention scores are added from this config.
  """
  # Scores and their weighted sum, forward and backward, per layer.
  attention = lambda c, layers, queries, keys: (
      12 * layers * c.num_heads * c.head_dim * queries * keys)
  head = 6 * _head_params(cfg, params)
  if family_of(cfg).seq2seq:
    s, t = encoder_length, decoder_length
    enc = (6 * _matmul_params(params, paths.ENCODER) * s
           + attention(cfg, cfg.num_layers, s, s))
    dec = (6 * _matmul_params(params, paths.DECODER) * t
           + attention(cfg, cfg.decoder_layers, t, t + s))
    return float(enc + dec + head * (t if head_positions is None else head_positions))
  t = encoder_length
  stacks = [cfg] + ([generator] if generator else [])
  body = 6 * _matmul_params(params) * t + sum(
      attention(c, c.num_layers, t, t) for c in stacks)
  if pooled and not cfg.scan_layers:  # the last layer's weights but K and V: once
    once = (_matmul_params(params, paths.layer(cfg.num_layers - 1))
            - 2 * cfg.d_model * cfg.num_heads * cfg.head_dim)
    body -= (6 * once + attention(cfg, 1, 1, t)) * (t - 1)
  return float(body + head * (t if head_positions is None else head_positions))
