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
import os
import re
import statistics
from typing import Any

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
  current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      current = bodies.setdefault(header.group(1), [])
      continue
    inst = _INSTRUCTION.match(line)
    if not inst or current is None:
      continue
    name, shape, opcode = inst.groups()
    op_name = _OP_NAME.search(line)
    current.append((opcode, op_name.group(1) if op_name else ""))
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
  by_op: collections.Counter = collections.Counter()
  count: collections.Counter = collections.Counter()
  costliest: dict[str, tuple[float, str]] = {}  # name -> (time, its costliest instance)
  for instance, durations in calls.items():
    name = re.sub(r"\.\d+$", "", instance)
    us = sum(durations) if device_pids else statistics.median(durations) * len(durations)
    by_op[name] += us
    count[name] += len(durations)
    costliest[name] = max(costliest.get(name, (0.0, instance)), (us, instance))
  total = sum(by_op.values())
  if not total:
    raise ValueError(f"the trace in {logdir} has no op events (on a CPU, set "
                     f"{CPU_TRACE_FLAG} in XLA_FLAGS before jax starts)")
  by_kind: collections.Counter = collections.Counter()
  for name, us in by_op.items():
    by_kind[kind_of(name)] += us
  ms = lambda us: round(us / steps / 1e3, 2)
  what = fusion_summaries(hlo_text) if hlo_text else {}
  return {
      "source": "device" if device_pids else "host (XLA:CPU thunks)",
      "ms_per_step": ms(total),
      "kinds": [{"kind": k, "ms_per_step": ms(v), "share": round(v / total, 3)}
                for k, v in by_kind.most_common()],
      "ops": [{"op": k, "kind": kind_of(k), "ms_per_step": ms(v),
               "share": round(v / total, 3), "per_step": count[k] // steps,
               "what": what.get(_kernel_name(costliest[k][1]), "")}
              for k, v in by_op.most_common(top)],
  }


def markdown(title: str, breakdown: dict[str, Any]) -> str:
  """The breakdown as two small markdown tables."""
  lines = [f"**{title}**: {breakdown['ms_per_step']} ms of ops per step "
           f"({breakdown['source']})", "", "| kind | ms/step | share |", "|---|---:|---:|"]
  lines += [f"| {k['kind']} | {k['ms_per_step']} | {100 * k['share']:.1f}% |"
            for k in breakdown["kinds"]]
  lines += ["", "| op | kind | ms/step | share | per step | what |",
            "|---|---|---:|---:|---:|---|"]
  lines += [f"| {o['op']} | {o['kind']} | {o['ms_per_step']} | {100 * o['share']:.1f}% "
            f"| {o['per_step']} | {o.get('what', '')} |" for o in breakdown["ops"]]
  return "\n".join(lines)
