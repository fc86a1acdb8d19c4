"""Where a train step's device time goes, from a ``jax.profiler`` trace.

``jaxtl benchmark --profile=DIR`` traces the timed steps and prints
:func:`op_breakdown`: device time per step by kind of op (matmuls, attention
kernels, collectives, layout copies, other fusions) and the costliest ops,
so "what limits this preset" is read from a profile, not guessed. On GPUs the
trace holds the device's kernels; on CPUs the XLA thunks, which XLA records
only with ``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` (the
benchmark sets it for ``--profile``).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import math
import os
import re
import statistics
from typing import Any, Iterator

CPU_TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"

# Kinds of op, tried in order on the lower-cased op or kernel name.
KINDS = (
    ("collective", ("all-reduce", "all_reduce", "allreduce", "all-gather", "all_gather",
                    "reduce-scatter", "reduce_scatter", "all-to-all", "nccl",
                    "collective-permute")),
    ("attention", ("flash", "fmha", "cudnn", "dot_product_attention", "sdpa")),
    ("matmul", ("ynn_fusion", "xnn_fusion", "dot", "gemm", "matmul", "cublas", "nvjet",
                "cutlass", "xmma", "onednn")),
    ("copy/transpose", ("copy", "transpose", "memcpy", "memset")),
)
# Host events that are not XLA:CPU ops: Python frames ("$file:line name"),
# and the runtime's executor, thread-pool and dispatch spans around the ops
# (with JAX's dispatch inline, as jaxtl's commands run, the whole execution
# is one PjRt span on the calling thread).
_WRAPPERS = ("$", "ThunkExecutor", "SlinkyThreadPool", "PjitFunction", "CommonPjRt",
             "ThreadpoolListener", "Wait for ", "DevicePut", "PythonRefManager",
             "ParseArguments", "AllocateOutputBuffers", "end: ")
# XLA:CPU's control-flow thunks (lax.cond, while loops): each event spans
# the ops of its branch or body, which the trace records as well.
_CONTROL_FLOW = re.compile(r"(cond|conditional|while|call)(\.\d+)?$")


def kind_of(name: str) -> str:
  lower = name.lower()
  for kind, needles in KINDS:
    if any(n in lower for n in needles):
      return kind
  return "other fusions"


def _trace_events(logdir: str) -> tuple[list[dict[str, Any]], dict[int, str]]:
  files = sorted(glob.glob(os.path.join(logdir, "**", "perfetto_trace.json.gz"),
                           recursive=True), key=os.path.getmtime)
  if not files:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {logdir}: trace with "
                            "jax.profiler.trace(..., create_perfetto_trace=True)")
  with gzip.open(files[-1]) as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  processes = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  return events, processes


_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+) ([\w-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]+)"')
_CALLS = re.compile(r"calls=%([\w.-]+)")


def _lines_by_computation(hlo_text: str) -> Iterator[tuple[str, str]]:
  """(computation, line) for each line inside a computation of an HLO
  module's text."""
  current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      current = header.group(1)
    elif current is not None:
      yield current, line


def _kernel_name(instruction: str) -> str:
  """An HLO instruction's name as its kernel is named in traces
  (``fusion.12`` runs as ``fusion_12``)."""
  return re.sub(r"[.-]", "_", instruction)


def fusion_summaries(hlo_text: str) -> dict[str, str]:
  """What each fusion of an optimized HLO module computes, keyed by the name
  its kernel has in a GPU trace (``fusion.12`` runs as ``fusion_12``):
  its output shape, its costliest-looking ops and the JAX source op most of
  its instructions came from. A profile then says "the attention softmax"
  rather than "fusion_4521"."""
  bodies: dict[str, list[tuple[str, str]]] = {}  # computation -> (opcode, op_name)
  fusions: list[tuple[str, str, str, str]] = []  # (name, shape, calls, op_name)
  for computation, line in _lines_by_computation(hlo_text):
    inst = _INSTRUCTION.match(line)
    if not inst:
      continue
    name, shape, opcode = inst.groups()
    op_name = _OP_NAME.search(line)
    bodies.setdefault(computation, []).append((opcode, op_name.group(1) if op_name else ""))
    calls = _CALLS.search(line)
    if opcode == "fusion" and calls:
      fusions.append((name, shape, calls.group(1), op_name.group(1) if op_name else ""))
  boring = {"parameter", "constant", "broadcast", "bitcast", "reshape", "convert",
            "get-tuple-element", "tuple", "slice", "iota", "copy"}
  out = {}
  for name, shape, calls, op_name in fusions:
    body = bodies.get(calls, [])
    ops = collections.Counter(o for o, _ in body if o not in boring)
    sources = collections.Counter(n for _, n in body if n) or collections.Counter([op_name])
    source = "/".join(sources.most_common(1)[0][0].split("/")[-3:])
    what = ", ".join(o for o, _ in ops.most_common(4))
    out[_kernel_name(name)] = f"{shape.split('{')[0]} {what} <- {source}"
  return out


_TYPED = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]")
_DOT = re.compile(r"= (\w+)\[([\d,]*)\]\S* dot\((.*?)\)(?:,|$)")
_OPERAND = re.compile(r"(?:(\w+)\[([\d,]*)\]\S* )?%([\w.-]+)")


def _dims(text: str) -> tuple[int, ...]:
  return tuple(int(d) for d in text.split(",") if d)


def _dim_numbers(line: str, name: str) -> tuple[int, ...]:
  found = re.search(name + r"=\{([\d,]*)\}", line)
  return _dims(found.group(1)) if found else ()


def dot_forms(hlo_text: str) -> dict[str, tuple[str, float]]:
  """Each op of an optimized HLO module that multiplies matrices (a ``dot``,
  or a fusion around one, as XLA:CPU's ``ynn_fusion``s are), keyed by its
  kernel name (:func:`_kernel_name`): its form and its FLOPs per call.

  A form reads ``bf16[2048,384] @ bf16[384,1536] -> f32[2048,1536]``, an
  operand marked ``.T`` where the dot reads it transposed (contracting
  other than a row-major ``[..., M, K] @ [..., K, N]``): on a CPU the form
  decides which kernel a dot gets, so the profile shows each form's
  GFLOP/s (issue 34: a bf16 dot reached AMX only row-major). A rate above
  the CPU's peak marks an op whose work outlives its trace event: XLA:CPU's
  Eigen ``dot`` thunks hand theirs to the thread pool and return."""
  types: dict[str, tuple[str, tuple[int, ...]]] = {}
  inside: dict[str, list[tuple[str, float]]] = {}  # computation -> its dots
  own: dict[str, tuple[str, float]] = {}  # dot instruction -> (form, FLOPs)
  fusions: list[tuple[str, str]] = []  # (fusion, the computation it calls)
  for computation, line in _lines_by_computation(hlo_text):
    typed = _TYPED.match(line)
    if not typed:
      continue
    name, dtype, dims = typed.groups()
    out = _dims(dims)
    types[name] = (dtype, out)
    calls = _CALLS.search(line)
    if " fusion(" in line and calls:
      fusions.append((name, calls.group(1)))
    dot = _DOT.search(line)
    operands = [(t, _dims(d)) if t else types.get(n, ("?", ()))
                for t, d, n in _OPERAND.findall(dot.group(3))[:2]] if dot else []
    if len(operands) < 2:
      continue
    (lhs_type, lhs), (rhs_type, rhs) = operands
    batch = len(_dim_numbers(line, "lhs_batch_dims"))
    lhs_k = _dim_numbers(line, "lhs_contracting_dims")
    rhs_k = _dim_numbers(line, "rhs_contracting_dims")
    flops = 2.0 * math.prod(out) * math.prod(lhs[i] for i in lhs_k if i < len(lhs))
    lhs_t = "" if lhs_k == (len(lhs) - 1,) else ".T"
    rhs_t = "" if rhs_k == (batch,) and len(rhs) == batch + 2 else ".T"
    form = (f"{lhs_type}[{','.join(map(str, lhs))}]{lhs_t} @ "
            f"{rhs_type}[{','.join(map(str, rhs))}]{rhs_t} -> {dtype}[{dims}]")
    inside.setdefault(computation, []).append((form, flops))
    own[name] = (form, flops)
  forms = {_kernel_name(name): form for name, form in own.items()}
  for name, called in fusions:
    if inside.get(called):
      forms[_kernel_name(name)] = (" + ".join(f for f, _ in inside[called]),
                                   sum(n for _, n in inside[called]))
  return forms


def op_breakdown(logdir: str, steps: int, top: int = 12,
                 hlo_text: str = "") -> dict[str, Any]:
  """Per-step device time by kind of op, and the ``top`` costliest ops.

  Ops are the events of the device processes (``/device:...``) when the trace
  has any, else the host's XLA thunks. Names end in ``.N`` per instance
  (``fusion.12``); instances are summed under one name. With the compiled
  module's ``hlo_text``, each op also says what it computes
  (:func:`fusion_summaries`): for a name summed over instances (XLA:CPU's
  324 ``ynn_fusion.N`` dots of a step), what its costliest instance does.

  A host thunk is one HLO instruction, run the same way every step, so its
  time is its median call times its calls: on a shared CPU host one call
  in a few hundred stalled for 16-25 ms (a 0.3 ms transpose among them),
  and summed, those stalls made dozens of small ops look costly. A device
  kernel's name covers launches of many shapes, so kernels are summed.
  """
  events, processes = _trace_events(logdir)
  device_pids = {pid for pid, name in processes.items() if name.startswith("/device:")}
  calls: dict[str, list[float]] = collections.defaultdict(list)
  for e in events:
    if e.get("ph") != "X" or "dur" not in e:
      continue
    if device_pids and e["pid"] not in device_pids:
      continue
    if not device_pids and (e["name"].startswith(_WRAPPERS)
                            or _CONTROL_FLOW.match(e["name"])):
      continue
    calls[e["name"]].append(e["dur"])
  forms = dot_forms(hlo_text) if hlo_text else {}
  what = fusion_summaries(hlo_text) if hlo_text else {}
  by_op: collections.Counter = collections.Counter()  # (name, kind) -> us
  count: collections.Counter = collections.Counter()
  costliest: dict[tuple[str, str], tuple[float, str]] = {}  # its costliest instance
  dots: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0])
  for instance, durations in calls.items():
    name = re.sub(r"\.\d+$", "", instance)
    us = sum(durations) if device_pids else statistics.median(durations) * len(durations)
    kernel = _kernel_name(instance)
    form = forms.get(kernel)
    kind = kind_of(name)
    if form:
      kind = "matmul"
      dot = dots[form[0]]  # [us, calls, FLOPs]
      dot[0] += us
      dot[1] += len(durations)
      dot[2] += form[1] * len(durations)
    elif kind == "matmul" and kernel in what:
      kind = "other fusions"  # a library fusion of a reduction (ynn_fusion)
    key = (name, kind)
    by_op[key] += us
    count[key] += len(durations)
    costliest[key] = max(costliest.get(key, (0.0, instance)), (us, instance))
  total = sum(by_op.values())
  if not total:
    raise ValueError(f"the trace in {logdir} has no op events (on a CPU, set "
                     f"{CPU_TRACE_FLAG} in XLA_FLAGS before jax starts)")
  by_kind: collections.Counter = collections.Counter()
  for (_, kind), us in by_op.items():
    by_kind[kind] += us
  ms = lambda us: round(us / steps / 1e3, 2)
  return {
      "source": "device" if device_pids else "host (XLA:CPU thunks)",
      "ms_per_step": ms(total),
      "kinds": [{"kind": k, "ms_per_step": ms(v), "share": round(v / total, 3)}
                for k, v in by_kind.most_common()],
      "ops": [{"op": name, "kind": kind, "ms_per_step": ms(v),
               "share": round(v / total, 3), "per_step": count[name, kind] // steps,
               "what": what.get(_kernel_name(costliest[name, kind][1]), "")}
              for (name, kind), v in by_op.most_common(top)],
      "dots": [{"dot": form, "per_step": calls // steps, "ms_per_step": ms(us),
                "GFLOP/s": round(flops / us / 1e3) if us else 0}
               for form, (us, calls, flops) in sorted(dots.items(), key=lambda d: -d[1][0])
               ][:top],
  }


def markdown(title: str, breakdown: dict[str, Any]) -> str:
  """The breakdown as small markdown tables: by kind, by op, and (where
  the HLO names them) by dot form with its GFLOP/s."""
  lines = [f"**{title}**: {breakdown['ms_per_step']} ms of ops per step "
           f"({breakdown['source']})", "", "| kind | ms/step | share |", "|---|---:|---:|"]
  lines += [f"| {k['kind']} | {k['ms_per_step']} | {100 * k['share']:.1f}% |"
            for k in breakdown["kinds"]]
  lines += ["", "| op | kind | ms/step | share | per step | what |",
            "|---|---|---:|---:|---:|---|"]
  lines += [f"| {o['op']} | {o['kind']} | {o['ms_per_step']} | {100 * o['share']:.1f}% "
            f"| {o['per_step']} | {o.get('what', '')} |" for o in breakdown["ops"]]
  if breakdown.get("dots"):
    lines += ["", "| dot | per step | ms/step | GFLOP/s |", "|---|---:|---:|---:|"]
    lines += [f"| {d['dot']} | {d['per_step']} | {d['ms_per_step']} | {d['GFLOP/s']:,} |"
              for d in breakdown["dots"]]
  return "\n".join(lines)
