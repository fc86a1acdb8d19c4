"""Training-step benchmarks, with Hugging Face PyTorch side by side
(``jaxtl benchmark``, :mod:`jaxtl.programs.benchmark`).

Each preset is one model, objective, batch and length. jaxtl runs its real
train step (``train.train_step``: AdamW, global-norm clipping, dropout,
non-finite guard), jitted with the state donated, on a mesh over every local
device; PyTorch runs the same architecture built by ``transformers`` from the
config jaxtl would export (``jaxtl.convert``), with the same batch, AdamW and
clipping. Both compute in the same precision: in bfloat16 with float32
parameters and optimizer state (jaxtl: ``dtype=bfloat16``; PyTorch: bf16
autocast, on GPUs and CPUs alike) or in float32; ``--dtype=auto`` is what
the recipes compute in on this device
(:func:`jaxtl.runtime.xla_cpu.auto_precision`).
``keras_side`` adds KerasHub on the same JAX
(:mod:`jaxtl.tools.benchmark_keras`), the same way.

Reported per preset and side: step time (median over ``--steps`` steps after
``--warmup``, each step synchronised with the device; on a CPU, jaxtl's and
PyTorch's steps take turns for ``--rounds`` rounds), tokens/s, model FLOPs
per token and MFU (``jaxtl.train.perf``: 6 FLOPs per matmul weight per token plus
attention's score and value products; PyTorch is credited the same model
FLOPs), compile time (lowering + XLA compilation, and the first PyTorch
step), and peak device memory (``memory_stats()`` where the device keeps them,
else the compiled step's ``memory_analysis()``). The rows are printed and
appended, with date, device, versions and command, to ``--results``.

Batches are synthetic (uniform random token ids): this measures the step, not
the input pipeline; ``--pipeline=pretrain_mlm,...`` measures that instead, in
tokens/s and tokens/s per core. ``--memory`` reports parameter + optimizer
bytes per device under data-parallel, FSDP and tensor-parallel meshes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import re
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax

from jaxtl.runtime import malloc, xla_cpu
from jaxtl import objectives, train
from jaxtl.models import TransformerConfig, attention, paths
from jaxtl.tools.presets import (Measurement, Preset, init_inputs,
                                 jaxtl_step, lookup, make_batch, max_predictions,
                                 model_config, on_accelerator, optimizer_config,
                                 faster_in, peak_memory, time_alternated,
                                 time_steps)
from jaxtl.tools import benchmark_keras, benchmark_torch, other_checkout, profiling
from jaxtl.train import optim, perf, sharding

@dataclasses.dataclass
class Program:
  """jaxtl's compiled train step for one preset, ready to time."""
  run_step: Callable[[], Any]  # one step, blocking until it is done
  compiled: Any
  compile_s: float
  flops_per_row: float
  dtype: str  # what it computes in
  attention: str  # how it computes attention (attention_kernel)

  def measurement(self, step_s: float) -> Measurement:
    return Measurement(step_s, self.compile_s, *peak_memory(self.compiled))


def jaxtl_program(preset: Preset, cfg: TransformerConfig, devices: list[jax.Device],
                  seed: int = 0, loss_chunk_len: int = objectives.LOSS_CHUNK_LEN,
                  compiler_options: dict[str, Any] | None = None) -> Program:
  """jaxtl's train step on ``preset``, data-parallel over ``devices``,
  compiled with its state and batch in place (and XLA's DebugOptions
  ``compiler_options`` for this program alone, over ``XLA_FLAGS``)."""
  if preset.batch_size % len(devices):
    raise ValueError(f"batch {preset.batch_size} does not split over "
                     f"{len(devices)} devices: pass --batch_size or --devices")
  mesh = sharding.make_mesh((-1, 1, 1), devices)
  rules = sharding.make_rules()
  model, loss_fn, weight_fn = jaxtl_step(preset, cfg, loss_chunk_len)
  batch = make_batch(preset, seed)
  tx, schedule = optim.make_optimizer(optimizer_config(), total_steps=1000)
  state, shardings = train.create_sharded_state(
      model, tx, init_inputs(model, preset, batch), jax.random.key(seed), mesh, rules)
  step = train.jit_train_step(loss_fn, weight_fn, tx, shardings, mesh)
  rng = jax.random.key(seed + 1)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    device_batch = sharding.shard_batch(batch, mesh)
    start = time.perf_counter()
    compiled = step.lower(state, device_batch, rng, schedule).compile(
        compiler_options=compiler_options or None)
    compile_s = time.perf_counter() - start
  holder = [state]

  def run_step():
    holder[0], metrics = compiled(holder[0], device_batch, rng, schedule)
    jax.block_until_ready((holder[0], metrics))

  params = state.params[paths.BACKBONE] if preset.objective == "classify" else state.params
  flops = perf.flops_per_example(
      cfg, params, preset.length, preset.target_length,
      head_positions=(max_predictions(preset) if preset.objective == "mlm"
                      else 0 if preset.objective == "classify" else None),
      pooled=preset.objective == "classify")
  return Program(run_step, compiled, compile_s, flops, cfg.dtype, attention_kernel(cfg))


def _profile(run_step: Callable[[], Any], steps: int, logdir: str,
             hlo_text: str = "") -> None:
  """Traces ``steps`` steps into ``logdir``; prints and saves their op
  breakdown, and the compiled module as ``module.hlo.txt`` beside it (op
  names in the trace are its instruction names)."""
  if hlo_text:
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "module.hlo.txt"), "w") as f:
      f.write(hlo_text)
  with jax.profiler.trace(logdir, create_perfetto_trace=True):
    for _ in range(steps):
      run_step()
  breakdown = profiling.op_breakdown(logdir, steps, hlo_text=hlo_text)
  with open(os.path.join(logdir, "op_breakdown.json"), "w") as f:
    json.dump(breakdown, f, indent=1)
  print(profiling.markdown(f"{os.path.basename(logdir)} on {jax.devices()[0].device_kind}",
                           breakdown), flush=True)


# ----------------------------------------------------------------------------
# Reporting.

COLUMNS = ("preset", "batch x tokens", "dtype", "attention", "step ms", "tokens/s", "GFLOP/token",
           "MFU", "compile s", "peak GiB", "PyTorch step ms", "PyTorch tokens/s",
           "PyTorch MFU", "PyTorch peak GiB", "jaxtl / PyTorch")


def _gib(m: Measurement) -> str:
  """Peak memory; "(analysis)" marks XLA's estimate where the device keeps no
  statistics (CPUs)."""
  if m.peak_bytes is None:
    return "n/a"
  return f"{m.peak_bytes / 2**30:.2f}" + (
      " (analysis)" if m.memory_source == "memory_analysis" else "")


def _mfu(flops_per_s: float, peak: float | None) -> str:
  return "n/a" if not peak else f"{100 * flops_per_s / peak:.1f}%"


def attention_kernel(cfg: TransformerConfig) -> str:
  """How the train step computes attention: attention dropout needs the
  probabilities, so it takes the explicit einsum path; else what
  :func:`jaxtl.models.attention.attention_impl` picks."""
  if cfg.attention_dropout_rate > 0:
    return "explicit (dropout)"
  return attention.attention_impl(cfg, cfg.jnp_dtype)


def row(name: str, preset: Preset, program: Program, ours: Measurement,
        theirs: Measurement | None, peak_flops: float | None,
        keras: Measurement | None = None) -> dict[str, str]:
  """One results-table row for ``program`` measured as ``ours`` (strings, in
  COLUMNS order; KerasHub's figures after them where it was timed)."""
  flops_per_row = program.flops_per_row
  shape = f"{preset.batch_size} x {preset.length}" + (
      f"+{preset.target_length}" if preset.target_length else "")
  flops_per_s = lambda m: flops_per_row * preset.batch_size / m.step_s
  out = {"preset": name, "batch x tokens": shape, "dtype": program.dtype,
         "attention": program.attention,
         "step ms": f"{1e3 * ours.step_s:.1f}",
         "tokens/s": f"{ours.tokens_per_s(preset):,.0f}",
         "GFLOP/token": f"{flops_per_row / preset.tokens_per_row / 1e9:.3f}",
         "MFU": _mfu(flops_per_s(ours), peak_flops),
         "compile s": f"{ours.compile_s:.1f}", "peak GiB": _gib(ours),
         "PyTorch step ms": "", "PyTorch tokens/s": "", "PyTorch MFU": "",
         "PyTorch peak GiB": "", "jaxtl / PyTorch": ""}
  if theirs is not None:
    out.update({"PyTorch step ms": f"{1e3 * theirs.step_s:.1f}",
                "PyTorch tokens/s": f"{theirs.tokens_per_s(preset):,.0f}",
                "PyTorch MFU": _mfu(flops_per_s(theirs), peak_flops),
                "PyTorch peak GiB": _gib(theirs),
                "jaxtl / PyTorch": f"{theirs.step_s / ours.step_s:.2f}x"})
  if keras is not None:
    out.update({"KerasHub step ms": f"{1e3 * keras.step_s:.1f}",
                "KerasHub tokens/s": f"{keras.tokens_per_s(preset):,.0f}",
                "KerasHub compile s": f"{keras.compile_s:.1f}",
                "KerasHub peak GiB": _gib(keras),
                "jaxtl / KerasHub": f"{keras.step_s / ours.step_s:.2f}x"})
  return out


def environment() -> str:
  """Date, device and versions: the heading of a results block."""
  device = jax.devices()[0]
  kind = device.device_kind if device.platform != "cpu" else (
      f"CPU ({os.cpu_count()} cores, {perf.cpu_model()}; {malloc.describe()}; "
      f"{xla_cpu.describe()})")
  versions = [f"jax {jax.__version__}", f"flax {flax.__version__}"]
  # Read from the installed metadata, not imported: importing torch and
  # transformers for this heading kept each benchmark process on the GPU
  # machine alive for tens of seconds more, and keras-hub imports TensorFlow.
  for dist in ("torch", "transformers", "keras", "keras-hub"):
    try:
      versions.append(f"{dist} {importlib.metadata.version(dist)}")
    except importlib.metadata.PackageNotFoundError:
      pass
  return (f"{datetime.date.today().isoformat()} · {kind} · "
          + ", ".join(versions))


def markdown(rows: list[dict[str, str]]) -> str:
  columns = list(rows[0]) if rows else list(COLUMNS)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows]
  return "\n".join(lines)


def append_results(path: str, rows: list[dict[str, str]], command: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a") as f:
    f.write(f"\n### {environment()}\n\n`{command}`\n\n{markdown(rows)}\n")


def chosen_devices(num_devices: int) -> list[jax.Device]:
  """The first ``num_devices`` devices (0: all); more than there are is a
  mistake, not a quieter run on fewer."""
  devices = jax.devices()
  if num_devices > len(devices):
    raise ValueError(f"--devices={num_devices}: this machine has {len(devices)} "
                     f"{devices[0].platform} device(s)")
  return devices[:num_devices or None]


def sized(presets: list[Preset], batch_size: int, length: int,
          num_devices: int) -> list[Preset]:
  """The presets at ``batch_size`` and ``length`` where given (0: their own;
  on an accelerator, the preset's accelerator batch per device)."""
  out = []
  for preset in presets:
    if batch_size:
      preset = dataclasses.replace(preset, batch_size=batch_size)
    elif on_accelerator() and preset.accelerator_batch_size:
      preset = dataclasses.replace(
          preset, batch_size=preset.accelerator_batch_size * num_devices)
    if length:
      preset = dataclasses.replace(preset, length=length)
    out.append(preset)
  return out


def benchmark(names: list[str], *, torch_side: bool, warmup: int, steps: int,
              keras_side: bool = False,
              dtype: str = "auto", batch_size: int = 0, length: int = 0,
              num_devices: int = 0,
              overrides: dict[str, Any] | None = None,
              loss_chunk_len: int = objectives.LOSS_CHUNK_LEN,
              profile_dir: str = "", rounds: int = 0) -> list[dict[str, str]]:
  """Runs the named presets on ``num_devices`` devices (0: all); returns
  their table rows. PyTorch and KerasHub (``keras_side``) run on one device.

  With ``rounds`` on a CPU, jaxtl's and PyTorch's steps take turns,
  ``steps`` each per round (:func:`~jaxtl.tools.presets.time_alternated`),
  and the row says in how many rounds jaxtl's was the faster: a shared CPU
  host drifts by a third within minutes (PyTorch's MiniLM step ran 631 and
  882 ms in two runs ten minutes apart on the AMX Xeon), so only steps
  timed in turns give a ratio that holds. On accelerators the two run one
  after the other, never holding device memory at once."""
  devices = chosen_devices(num_devices)
  jobs = [(preset, model_config(preset, dtype, **(overrides or {})))
          for preset in sized(lookup(names), batch_size, length, len(devices))]
  # Per device in the dtype the configs resolved (every job has the same).
  peak_flops = perf.peak_flops_per_device(dtype=jobs[0][1].dtype) if jobs else None
  peak_flops = peak_flops and peak_flops * len(devices)
  # KerasHub first (a missing keras-hub stops here, before any run), in a
  # child process that hands the device back on exit.
  keras = (benchmark_keras.run_keras(jobs, warmup, steps) if keras_side
           else [None] * len(jobs))
  rows = []
  for name, (preset, cfg), theirs_keras in zip(names, jobs, keras):
    # PyTorch next: its caching allocator hands memory back before jax
    # allocates, so the two never share the device's memory.
    theirs, in_turns = None, torch_side and rounds > 0 and not on_accelerator()
    if torch_side and not in_turns:
      theirs = benchmark_torch.run_torch(preset, cfg, warmup, steps)
      benchmark_torch.release_memory()
    program = jaxtl_program(preset, cfg, devices, loss_chunk_len=loss_chunk_len)
    if in_turns:
      torch_step = benchmark_torch.torch_program(preset, cfg)
      (ours_s, theirs_s), wins = time_alternated(
          [program.run_step, torch_step.run_step], warmup, steps, rounds)
      theirs = torch_step.measurement(theirs_s)
    else:
      ours_s = time_steps(program.run_step, warmup, steps)
    if profile_dir:  # ``steps`` more steps traced, their op breakdown printed
      _profile(program.run_step, steps, os.path.join(profile_dir, name),
               program.compiled.as_text())
    rows.append(row(name, preset, program, program.measurement(ours_s), theirs,
                    peak_flops, theirs_keras))
    if in_turns:
      rows[-1]["jaxtl faster in"] = faster_in(wins[0], rounds)
    print(json.dumps(rows[-1]), flush=True)
  return rows


def versus(names: list[str], changed: dict[str, Any], *, warmup: int, steps: int,
           rounds: int, dtype: str = "auto", batch_size: int = 0, length: int = 0,
           num_devices: int = 0, overrides: dict[str, Any] | None = None,
           loss_chunk_len: int = objectives.LOSS_CHUNK_LEN) -> list[dict[str, str]]:
  """Each named preset's step as configured and with the ``changed``
  TransformerConfig fields, XLA options (names starting ``xla_``, given to
  this one compile: :func:`jaxtl_program`) and ``cpu_rule`` (this CPU's
  place in that :mod:`jaxtl.runtime.xla_cpu` rule table flipped:
  :func:`~jaxtl.runtime.xla_cpu.flipped`), or as another checkout builds
  it (``commit=REV`` of this git repository, or ``tree=PATH``, a directory
  holding a ``jaxtl`` package: :mod:`jaxtl.tools.other_checkout`); both
  compiled in this process and timed in alternating rounds
  (:func:`~jaxtl.tools.presets.time_alternated`); two rows per preset, each
  saying in how many rounds it was the faster."""
  devices = chosen_devices(num_devices)
  checkout = {k: v for k, v in changed.items() if k in CHECKOUT}
  if checkout and len(changed) > 1:
    raise ValueError(f"--versus {', '.join(f'{k}={v}' for k, v in changed.items())}: "
                     f"{' or '.join(CHECKOUT)} times another checkout's step as it "
                     "stands; give it alone")
  rows = []
  label = " ".join(f"{k} {v}" for k, v in checkout.items())
  with (other_checkout.commit_tree(checkout["commit"]) if "commit" in checkout
        else contextlib.nullcontext(checkout.get("tree"))) as tree:
    for name, preset in zip(names, sized(lookup(names), batch_size, length, len(devices))):
      base = model_config(preset, dtype, **(overrides or {}))
      if checkout:
        other = _checkout_program(tree, label, name, devices, dtype=dtype,
                                  batch_size=batch_size, length=length,
                                  overrides=overrides or {}, loss_chunk_len=loss_chunk_len)
      else:
        label, other = _changed_program(preset, base, changed, devices, dtype=dtype,
                                        overrides=overrides or {},
                                        loss_chunk_len=loss_chunk_len)
      base_program = jaxtl_program(preset, base, devices, loss_chunk_len=loss_chunk_len)
      if CPU_RULE in changed and same_program(base_program.compiled, other.compiled):
        raise ValueError(f"--versus {label}: {name}'s step is the same program either "
                         f"way ({base.dtype}, row_major_dots={base.row_major_dots}): the "
                         "rule does not reach it")
      programs = {"as configured": base_program, label: other}
      medians, wins = time_alternated([p.run_step for p in programs.values()],
                                      warmup, steps, rounds)
      for (side, program), step_s, won in zip(programs.items(), medians, wins):
        full = row(name, preset, program, program.measurement(step_s), None, None)
        rows.append({"preset": name, "change": side, **{
            k: full[k] for k in ("batch x tokens", "dtype", "attention", "step ms",
                                 "tokens/s", "compile s", "peak GiB")},
                     "faster in": faster_in(won, rounds)})
        print(json.dumps(rows[-1]), flush=True)
  return rows


def _changed_program(preset: Preset, base: TransformerConfig, changed: dict[str, Any],
                     devices: list[jax.Device], *, dtype: str, overrides: dict[str, Any],
                     loss_chunk_len: int) -> tuple[str, Program]:
  """:func:`versus`'s second step for config fields, XLA options and a CPU
  rule, compiled first: an option this XLA lacks, or a bad value, fails at
  once."""
  rule = changed.get(CPU_RULE)
  xla = {k: v for k, v in changed.items() if k.startswith(XLA_OPTION)}
  fields = {**overrides,
            **{k: v for k, v in changed.items() if k not in xla and k != CPU_RULE}}
  label = ", ".join(f"{k}={v}" for k, v in changed.items())
  with xla_cpu.flipped(rule) if rule else contextlib.nullcontext() as inside:
    cfg = model_config(preset, dtype, **fields)
    if base == cfg and not xla and not rule:
      # row_major_dots=false cannot undo a CPU rule that turns them on.
      hint = ("; this CPU's rule turns them on: time it off with --versus=cpu_rule="
              + xla_cpu.ROW_MAJOR_TABLES[cfg.dtype]
              if fields.get("row_major_dots") is False and cfg.row_major_dots else "")
      raise ValueError(f"--versus {label}: the same model as configured (with "
                       f"--dtype={dtype}, {cfg.dtype} computes with "
                       f"row_major_dots={cfg.row_major_dots}{hint}); nothing to compare")
    if rule:
      label += f" (this CPU {'in' if inside else 'out'})"
    try:
      return label, jaxtl_program(preset, cfg, devices, compiler_options=xla,
                                  loss_chunk_len=loss_chunk_len)
    except jax.errors.JaxRuntimeError as e:
      if not any(k in str(e) for k in xla):
        raise
      raise ValueError(f"--versus: {str(e).removeprefix('INVALID_ARGUMENT: ')}") from None


def _checkout_program(tree: str, label: str, name: str, devices: list[jax.Device], *,
                      dtype: str, batch_size: int, length: int, overrides: dict[str, Any],
                      loss_chunk_len: int) -> Program:
  """Preset ``name``'s step as the checkout at ``tree`` builds it, with its
  own presets, config rules and train step (the ``--model`` overrides
  applied to its config)."""
  with other_checkout.imported(tree) as theirs:
    try:
      preset, = theirs.sized(theirs.lookup([name]), batch_size, length, len(devices))
      cfg = theirs.model_config(preset, dtype, **overrides)
      program = theirs.jaxtl_program(preset, cfg, devices, loss_chunk_len=loss_chunk_len)
      attention = theirs.attention_kernel(cfg)
    except (AttributeError, TypeError) as e:
      raise ValueError(f"--versus {label}: its jaxtl.tools.benchmark does not build "
                       f"a step as this one's does ({e}); compare with a later "
                       "commit") from None
  return Program(program.run_step, program.compiled, program.compile_s,
                 program.flops_per_row, cfg.dtype, attention)


# Where a compiled module says its ops came from: the lines that traced
# them, which differ between two traces of the same program.
_SOURCE_LOCATIONS = re.compile(
    r", metadata=\{[^}]*\}|^\d+ [{\"].*$|^(FileNames|FunctionNames|FileLocations|StackFrames)$",
    re.M)


def same_program(a: Any, b: Any) -> bool:
  """Whether two compiled steps are the same program, where they were
  traced from makes no difference."""
  def body(compiled: Any) -> list[str]:
    return [line for line in _SOURCE_LOCATIONS.sub("", compiled.as_text()).splitlines()
            if line.strip()]
  return body(a) == body(b)


XLA_OPTION = "xla_"  # a --versus item naming one of XLA's DebugOptions
CPU_RULE = "cpu_rule"  # a --versus item naming a rule table of jaxtl.runtime.xla_cpu
CHECKOUT = ("commit", "tree")  # --versus items naming another checkout of jaxtl


def parse_overrides(items: list[str], flag: str = "--model",
                    versus_items: bool = False) -> dict[str, Any]:
  """``["remat=full", "scan_layers=true"]`` -> TransformerConfig field values
  (and, with ``versus_items``, ``xla_NAME=VALUE`` items as XLA options and
  ``cpu_rule=TABLE``, the rule table :func:`versus` flips); a bad item's
  error names ``flag``, where it came from."""
  fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if sep and versus_items and key == CPU_RULE:
      if value not in xla_cpu.RULE_TABLES:
        raise ValueError(f"{flag} {item!r}: expected {CPU_RULE}=TABLE with TABLE one of "
                         f"{', '.join(xla_cpu.RULE_TABLES)}")
      out[key] = value
      continue
    if sep and versus_items and key in CHECKOUT:
      if not value:
        raise ValueError(f"{flag} {item!r}: expected {key}=" + (
            "REV, a commit of this git repository" if key == "commit" else
            "PATH, a directory holding a jaxtl package"))
      out[key] = value
      continue
    if sep and versus_items and key.startswith(XLA_OPTION):
      # Spelled as DebugOptions are (enums by their full names); bools from
      # text, the rest as text (XLA parses numbers from it).
      out[key] = {"true": True, "false": False}.get(value.lower(), value)
      continue
    if not sep or key not in fields:
      also = (f", an XLA option, xla_NAME=VALUE, {CPU_RULE}=TABLE, commit=REV "
              "or tree=PATH" if versus_items else "")
      raise ValueError(f"{flag} {item!r}: expected FIELD=VALUE with FIELD one of "
                       f"{sorted(fields)}{also}")
    default = fields[key].default
    if isinstance(default, bool):
      out[key] = value.lower() in ("1", "true", "yes")
    elif isinstance(default, (int, float)):
      out[key] = type(default)(value)
    else:
      out[key] = value or None
  return out
