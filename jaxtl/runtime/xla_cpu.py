"""XLA:CPU flags chosen by the CPU a process starts on.

The same XLA:CPU build is fastest with different matmul back ends on
different CPUs. On the AMD EPYC this project measures on, XLA's default
YNNPACK matmuls are 1.7-2x as fast as PyTorch's; on an Intel Xeon with AMX
(Sapphire Rapids) they took 1.50 s of a 2.23 s MiniLM step, and turning
YNNPACK's fusions off for oneDNN's matmuls (which use AMX) took the step
from 1.93-2.00 s to about 1.67 s (issue 19). So an entry point picks the
flags for the CPU it finds (:func:`apply`, called by
:func:`jaxtl.runtime.startup.tune_process` before JAX starts its CPU client, which
reads ``XLA_FLAGS`` once). docs/studies/performance.md has the
measurements behind each rule.

A user's own ``XLA_FLAGS`` naming any of these flags wins, and
``JAXTL_CPU_FLAGS=0`` turns the choice off (and with it
:func:`bf16_matmuls`, which ``auto`` precision asks: :func:`auto_precision`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping, MutableMapping

CPUINFO = "/proc/cpuinfo"
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Cpu:
  """What /proc/cpuinfo says about the first core."""
  name: str
  vendor: str
  flags: frozenset[str]
  generation: str = ""  # "family 25 model 17": one model name covers several


def read_cpu(cpuinfo: str = CPUINFO) -> Cpu | None:
  """The first core's model name, vendor and ISA flags; None where
  /proc/cpuinfo cannot be read (not Linux)."""
  fields: dict[str, str] = {}
  try:
    with open(cpuinfo) as f:
      for line in f:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    return None
  generation = " ".join(f"{key} {fields[key]}" for key in ("cpu family", "model")
                        if fields.get(key))
  return Cpu(fields.get("model name", ""), fields.get("vendor_id", ""),
             frozenset(fields.get("flags", "").split()), generation.removeprefix("cpu "))


@dataclasses.dataclass(frozen=True)
class Rule:
  """What jaxtl chooses for the CPUs a rule matches (XLA flags, or none
  where the rule's table says what it is for), and the measurement that
  chose it."""
  vendor: str
  needs: frozenset[str]  # ISA flags the CPU must have
  flags: tuple[str, ...]
  why: str

  def matches(self, cpu: Cpu) -> bool:
    return cpu.vendor == self.vendor and self.needs <= cpu.flags


RULES = (
    Rule("GenuineIntel", frozenset({"amx_tile"}),
         ("--xla_cpu_use_onednn=true", "--xla_cpu_experimental_ynn_fusion_type="),
         "oneDNN's AMX matmuls instead of YNNPACK's: MiniLM step 1.93-2.00 s -> "
         "about 1.67 s on a 2-core Sapphire Rapids"),
)


# CPUs where a bf16 matmul that accumulates in float32, in the row-major
# form jaxtl.models.dense_dots gives every dense layer, runs about twice as
# fast as a float32 one in XLA:CPU (YNNPACK's AVX512-BF16 kernels), so
# ``auto`` precision computes in bfloat16 there (:func:`auto_precision`). An
# AMX Xeon is not among them yet: the Intel rule above gives its matmuls to
# oneDNN, which leaves AMX out (issue 34 measures it).
BF16_RULES = (
    Rule("AuthenticAMD", frozenset({"avx512_bf16"}), (),
         "MiniLM step 952-988 ms float32 -> 563-626 ms bfloat16 with row-major "
         "dots on a 2-core EPYC, family 25 model 17 (Zen 4)"),
)


def bf16_matmuls(cpu: Cpu | None, environ: Mapping[str, str] = os.environ) -> Rule | None:
  """The rule saying bf16 matmuls pay on ``cpu``, or None (also when opted
  out of per-CPU choices with ``JAXTL_CPU_FLAGS=0``)."""
  if cpu is None or environ.get("JAXTL_CPU_FLAGS") == "0":
    return None
  return next((rule for rule in BF16_RULES if rule.matches(cpu)), None)


def auto_precision(backend: str, keep_float32: str | None) -> tuple[str, bool]:
  """(dtype, row-major dots) that ``auto`` computes in on ``backend``
  (``jax.default_backend()``): fine-tuning's ``train.compute_dtype``, a
  recipe's ``model.dtype``, a loaded model's ``compute_dtype``.

  bfloat16 on a GPU or TPU, whose matrix units multiply bf16 at twice
  float32's (TF32's) rate or more, and which every accelerator figure of
  the benchmarks was measured in; bfloat16 with row-major dots on a CPU
  whose bf16 matmuls run about twice as fast as float32 ones
  (:func:`bf16_matmuls`); float32 on any other CPU, where bf16 is slower
  and float32 exact. A bfloat16 choice is said in one log line ending with
  ``keep_float32``, the flag that keeps float32 (None: not said, for a
  caller whose own choice follows). Parameters, optimizer state, norm
  statistics and the loss stay float32 either way."""
  if backend != "cpu":
    if keep_float32 is not None:
      log.info("computing in bfloat16 (auto) on %s; %s computes in float32",
               backend.upper(), keep_float32)
    return "bfloat16", False
  cpu = read_cpu()
  rule = bf16_matmuls(cpu)
  if cpu is None or rule is None:
    return "float32", False
  if keep_float32 is not None:
    log.info(
        "computing in bfloat16 (auto): this CPU (%s, %s) multiplies bf16 about twice as "
        "fast as float32; %s computes in float32", cpu.name, " ".join(sorted(rule.needs)),
        keep_float32)
  return "bfloat16", True


def _flag_name(flag: str) -> str:
  return flag.split("=", 1)[0]


def flags_for(cpu: Cpu | None, environ: Mapping[str, str]) -> tuple[str, ...]:
  """The flags to add to ``XLA_FLAGS`` for ``cpu``: none when opted out
  (``JAXTL_CPU_FLAGS=0``), when no rule matches, or for any flag the user's
  ``XLA_FLAGS`` already names."""
  if cpu is None or environ.get("JAXTL_CPU_FLAGS") == "0":
    return ()
  user = {_flag_name(f) for f in environ.get("XLA_FLAGS", "").split()}
  return tuple(flag for rule in RULES if rule.matches(cpu)
               for flag in rule.flags if _flag_name(flag) not in user)


def apply(environ: MutableMapping[str, str] = os.environ,
          cpuinfo: str = CPUINFO) -> tuple[str, ...]:
  """Adds this CPU's flags to ``environ["XLA_FLAGS"]``; returns them.

  Must run before JAX creates its CPU client (first use of a device), and
  is inherited by a restarted or child process.
  """
  added = flags_for(read_cpu(cpuinfo), environ)
  if added:
    environ["XLA_FLAGS"] = " ".join(filter(None, [environ.get("XLA_FLAGS", ""), *added]))
  return added


def describe(environ: Mapping[str, str] = os.environ) -> str:
  """This process's XLA:CPU flags, for benchmark headings."""
  chosen = [f for f in environ.get("XLA_FLAGS", "").split() if f.startswith("--xla_cpu")]
  return "XLA:CPU flags: " + (" ".join(chosen) if chosen else "default")
