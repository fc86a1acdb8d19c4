"""What jaxtl chooses by the CPU a process runs on: the precision ``auto``
computes in.

XLA:CPU multiplies bfloat16 about twice as fast as float32 on some CPUs
and not at all faster on others, and only in one form (row-major dots that
accumulate in float32, :mod:`jaxtl.models.dense_dots`). So ``auto``
precision reads the CPU (:func:`read_cpu`) and computes in bfloat16 with
row-major dots where a rule of :data:`BF16_RULES` says it pays, float32
elsewhere (:func:`auto_precision`); bfloat16 asked for by name gets the
row-major dots there too, and so does float32 where a rule of
:data:`FLOAT32_ROW_MAJOR_RULES` says it pays (:func:`row_major_dots`), their
input's gradient folded as XLA likes where :data:`FLOAT32_FOLDED_DX_RULES`
says so (:func:`folds_float32_dx`). ``JAXTL_CPU_FLAGS=0`` turns the choices
off. docs/studies/performance.md has the measurements behind each rule;
``jaxtl benchmark --versus=cpu_rule=TABLE`` (:func:`flipped`) measures one
on the CPU it runs on, before a rule names that CPU.

XLA's own flags are left at XLA's defaults on every CPU: an Intel rule that
gave matmuls to oneDNN (issue 19) made an AMX Xeon's float32 MiniLM step
5% slower and its bfloat16 step twice as slow (issue 34).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from typing import Iterator, Mapping

CPUINFO = "/proc/cpuinfo"
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Cpu:
  """What /proc/cpuinfo says about the first core."""
  name: str
  vendor: str
  flags: frozenset[str]
  generation: str = ""  # "family 25 model 17": one model name covers several


@functools.cache
def read_cpu(cpuinfo: str = CPUINFO) -> Cpu | None:
  """The first core's model name, vendor and ISA flags; None where
  /proc/cpuinfo cannot be read (not Linux). Read once per path: the model
  asks at every trace of a dense layer (:func:`folds_float32_dx`)."""
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
  """The CPUs a choice is for (a vendor, the ISA flags they must have and,
  where the flags do not tell generations apart, the generation), and the
  measurement that chose it."""
  vendor: str
  needs: frozenset[str]  # ISA flags the CPU must have
  why: str
  generation: str = ""  # "family 25 model 1"; empty: any with the flags

  def matches(self, cpu: Cpu) -> bool:
    return (cpu.vendor == self.vendor and self.needs <= cpu.flags
            and self.generation in ("", cpu.generation))


# CPUs where a bf16 matmul that accumulates in float32, in the row-major
# form jaxtl.models.dense_dots gives every dense layer, runs about twice as
# fast as a float32 one in XLA:CPU (YNNPACK's AVX512-BF16 and AMX kernels),
# so ``auto`` precision computes in bfloat16 there (:func:`auto_precision`).
BF16_RULES = (
    Rule("AuthenticAMD", frozenset({"avx512_bf16"}),
         "MiniLM step 952-988 ms float32 -> 563-626 ms bfloat16 with row-major "
         "dots on a 2-core EPYC, family 25 model 17 (Zen 4)"),
    Rule("GenuineIntel", frozenset({"amx_bf16"}),
         "MiniLM step 1100-1195 ms float32 -> 558-599 ms bfloat16 with row-major "
         "dots on a 2-core Xeon with AMX, family 6 model 207"),
)


# CPUs where float32 runs faster with row-major dots (only ``w.T`` written
# out: jaxtl.models.dense_dots), so float32 asked for by name gets them.
# Measured one step a round in turns (`jaxtl benchmark --dtype=float32
# --versus=row_major_dots=true --steps=1`), where earlier rounds of 4-6
# steps had not settled it.
FLOAT32_ROW_MAJOR_RULES = (
    Rule("GenuineIntel", frozenset({"amx_bf16"}),
         "MiniLM float32 step 985.8 -> 929.3 ms at 32 x 64 (faster in 32 of 40 "
         "rounds), 284.2 -> 270.0 at 32 x 16 and 267.8 -> 260.5 at 10 x 48 (42 of "
         "60 each) on a 2-core Xeon with AMX, family 6 model 207"),
    # An AVX2-only EPYC of family 23 showed no difference (spread of 10%),
    # so this one is the Zen 3 generation alone.
    Rule("AuthenticAMD", frozenset({"avx2"}),
         "MiniLM float32 step 1013.5 -> 941.1 ms at 32 x 64 (faster in 38 of 40 "
         "rounds), 310.4 -> 295.7 at 32 x 16 (48 of 60) and 292.4 -> 281.3 at "
         "10 x 48 (43 of 60) on a 2-core AVX2-only EPYC (Zen 3)",
         generation="family 25 model 1"),
    # The AMD CPUs of BF16_RULES, so that float32 asked for by name there
    # takes the dots its bf16 default does.
    Rule("AuthenticAMD", frozenset({"avx512_bf16"}),
         "MiniLM float32 step 784.2 -> 721.4 ms at 32 x 64 (faster in 39 of 40 "
         "rounds), 199.0 -> 196.4 at 10 x 48 (29 of 40) on a 2-core EPYC, family "
         "25 model 17 (Zen 4)"),
)


# CPUs where float32's row-major dense layers should leave the input's
# gradient ``g @ w.T`` to XLA, which folds the transpose into the dot
# (YNNPACK takes that form here), instead of writing ``w.T`` out
# (jaxtl.models.dense_dots). Measured against writing it out, one step a
# round in turns.
FLOAT32_FOLDED_DX_RULES = (
    Rule("AuthenticAMD", frozenset({"avx2"}),
         "MiniLM float32 step with row-major dots 292.6 -> 280.2 ms at 10 x 48 "
         "(faster in 48 of 60 rounds), 1086.6 -> 1073.5 at 32 x 64 (28 of 40) on "
         "a 2-core AVX2-only EPYC (Zen 3)",
         generation="family 25 model 1"),
    Rule("AuthenticAMD", frozenset({"avx512_bf16"}),
         "MiniLM float32 step with row-major dots 199.9 -> 195.0 ms at 10 x 48 "
         "(faster in 30 of 40 rounds), 753.6 -> 743.4 at 32 x 64 (23 of 40), peak "
         "0.44 -> 0.41 GiB, on a 2-core EPYC, family 25 model 17 (Zen 4)"),
    # The Xeon of family 6 model 207 (Emerald Rapids) measured the other
    # way: writing w.T out was faster there (dense_dots' docstring).
    Rule("GenuineIntel", frozenset({"amx_bf16"}),
         "MiniLM float32 step with row-major dots 202.9 -> 188.5 ms at 10 x 48, "
         "689.6 -> 666.3 at 32 x 64 (faster in 37 of 40 rounds each), peak 0.44 -> "
         "0.41 GiB, on a 2-core Xeon with AMX and 480 MiB of L3 that reports "
         "family 6 model 167",
         generation="family 6 model 167"),
)


# The tables a rule can be added to, by name (``jaxtl benchmark
# --versus=cpu_rule=NAME``).
RULE_TABLES = ("BF16_RULES", "FLOAT32_ROW_MAJOR_RULES", "FLOAT32_FOLDED_DX_RULES")
# The table that gives a model computing in each dtype row-major dots.
ROW_MAJOR_TABLES = {"bfloat16": "BF16_RULES", "float32": "FLOAT32_ROW_MAJOR_RULES"}


@contextlib.contextmanager
def flipped(table: str) -> Iterator[bool]:
  """Within it, this process's CPU is out of the rule table named ``table``
  if a rule there matches it, and in it if none does; yields whether it is
  in. How a rule is measured before it is written: ``jaxtl benchmark
  --versus=cpu_rule=NAME`` builds its second step inside (the choices are
  read when a model is configured and traced). Not thread-safe: it swaps
  the module's table for the block's length."""
  if table not in RULE_TABLES:
    raise ValueError(f"no rule table {table!r}; tables: {', '.join(RULE_TABLES)}")
  cpu = read_cpu()
  if _choices_off(cpu, os.environ):
    raise ValueError(f"{table}: no per-CPU choices in this process (JAXTL_CPU_FLAGS=0, "
                     "or no /proc/cpuinfo), so there is nothing to flip")
  rules = globals()[table]
  kept = tuple(rule for rule in rules if not rule.matches(cpu))
  inside = len(kept) == len(rules)
  globals()[table] = (kept + (Rule(cpu.vendor, frozenset(), "flipped to measure it",
                                   cpu.generation),) if inside else kept)
  try:
    yield inside
  finally:
    globals()[table] = rules


def _choices_off(cpu: Cpu | None, environ: Mapping[str, str]) -> bool:
  """No per-CPU choice applies: the CPU is unknown, or opted out with
  ``JAXTL_CPU_FLAGS=0``."""
  return cpu is None or environ.get("JAXTL_CPU_FLAGS") == "0"


def _rule_for(rules: tuple[Rule, ...], cpu: Cpu | None,
              environ: Mapping[str, str]) -> Rule | None:
  if _choices_off(cpu, environ):
    return None
  return next((rule for rule in rules if rule.matches(cpu)), None)


def _this_cpu_in(rules: tuple[Rule, ...], backend: str) -> bool:
  """Whether ``backend`` is a CPU that one of ``rules`` matches (this
  process's CPU, unless opted out)."""
  return backend == "cpu" and _rule_for(rules, read_cpu(), os.environ) is not None


def bf16_matmuls(cpu: Cpu | None, environ: Mapping[str, str] = os.environ) -> Rule | None:
  """The rule saying bf16 matmuls pay on ``cpu``, or None (also when opted
  out of per-CPU choices with ``JAXTL_CPU_FLAGS=0``)."""
  return _rule_for(BF16_RULES, cpu, environ)


def auto_precision(backend: str, keep_float32: str | None) -> str:
  """The dtype that ``auto`` computes in on ``backend``
  (``jax.default_backend()``): fine-tuning's ``train.compute_dtype``, a
  recipe's ``model.dtype``, a loaded model's ``compute_dtype``.

  bfloat16 on a GPU or TPU, whose matrix units multiply bf16 at twice
  float32's (TF32's) rate or more, and which every accelerator figure of
  the benchmarks was measured in; bfloat16 with row-major dots on a CPU
  whose bf16 matmuls run about twice as fast as float32 ones
  (:func:`bf16_matmuls`; :func:`row_major_dots` says the form); float32 on
  any other CPU, where bf16 is slower and float32 exact. A bfloat16 choice is said in one log line ending with
  ``keep_float32``, the flag that keeps float32 (None: not said, for a
  caller whose own choice follows). Parameters, optimizer state, norm
  statistics and the loss stay float32 either way."""
  if backend != "cpu":
    if keep_float32 is not None:
      log.info("computing in bfloat16 (auto) on %s; %s computes in float32",
               backend.upper(), keep_float32)
    return "bfloat16"
  cpu = read_cpu()
  rule = bf16_matmuls(cpu)
  if cpu is None or rule is None:
    return "float32"
  if keep_float32 is not None:
    log.info(
        "computing in bfloat16 (auto): this CPU (%s, %s) multiplies bf16 about twice as "
        "fast as float32; %s computes in float32", cpu.name, " ".join(sorted(rule.needs)),
        keep_float32)
  return "bfloat16"


def row_major_dots(backend: str, dtype: str) -> bool:
  """Whether a model computing in ``dtype`` on ``backend`` should run its
  dense layers as row-major dots (:mod:`jaxtl.models.dense_dots`): bfloat16
  on a CPU of :data:`BF16_RULES`, however bfloat16 was chosen, and float32
  on a CPU of :data:`FLOAT32_ROW_MAJOR_RULES`.

  Without them XLA:CPU gives autodiff's transposed bf16 dots to slow
  kernels, and bfloat16 asked for by name ran slower than float32: on the
  AMX Xeon (family 6 model 207) a bf16 fine-tune of 9,000 SST-2 sentences
  trained its epoch in 179-190 s, against 95-101 s with row-major dots. The
  function computed is the same either way."""
  table = ROW_MAJOR_TABLES.get(dtype)
  return table is not None and _this_cpu_in(globals()[table], backend)


def folds_float32_dx(backend: str) -> bool:
  """Whether a float32 row-major dense layer (:mod:`jaxtl.models.dense_dots`)
  on ``backend`` leaves its input's gradient to XLA rather than writing
  ``w.T`` out: on a CPU of :data:`FLOAT32_FOLDED_DX_RULES` only. Elsewhere
  (the AMX Xeon) writing it out was faster. The function computed is the
  same either way."""
  return _this_cpu_in(FLOAT32_FOLDED_DX_RULES, backend)


def describe(environ: Mapping[str, str] = os.environ) -> str:
  """This process's XLA:CPU flags, for benchmark headings."""
  chosen = [f for f in environ.get("XLA_FLAGS", "").split() if f.startswith("--xla_cpu")]
  return "XLA:CPU flags: " + (" ".join(chosen) if chosen else "default")
