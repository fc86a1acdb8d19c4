"""What a compiled program moves through memory, kernel by kernel, read
from its optimised HLO: bytes read and written by each launch, FLOPs of
its matmuls and attention, attributed to the model part that made it.

On a GPU the elementwise kernels between the matmuls are bound by memory
bandwidth, so their bytes are their time; matmuls and attention are bound
by FLOPs. :func:`seconds` turns both into time with a device's figures:
not a profile, but the same program's kernels, so a change to the model
shows its effect here before a device measures it. The HLO can
come from a GPU compile on a machine without one (``launch/gpu_traffic.py``).

Bytes are each kernel's operands and results, with operands a fusion only
slices counted at the slices' size and a buffer updated in place at the
update's; a loop's body counts once per trip.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Iterable

# Bytes per element of HLO's primitive types.
_WIDTH = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
          "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
          "f64": 8}
_SHAPE = re.compile(r"\b(" + "|".join(_WIDTH) + r")\[([0-9,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][\w-]*)\((.*?)\)(?:, (.*))?$")
_OPERAND = re.compile(r"%([\w.\-]+)")
# Instructions that launch nothing.
_FREE = {"parameter", "bitcast", "get-tuple-element", "tuple", "constant",
         "after-all", "partition-id", "replica-id", "opt-barrier", "copy-start",
         "copy-done", "add-dependency"}
# Ops that read only part of their first operand, and ops a fusion may put
# between a parameter and them without reading more of it.
_SLICES = {"slice", "dynamic-slice", "gather"}
_PASS_THROUGH = {"bitcast", "convert", "reshape", "copy"}


def _dims(shape: str) -> list[tuple[str, list[int]]]:
  return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in _SHAPE.findall(shape)]


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape, tuples summed: ``bf16[2,3]{1,0}`` -> 12."""
  return sum(_WIDTH[t] * math.prod(d) for t, d in _dims(shape))


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shape: str
  op: str
  operands: tuple[str, ...]
  args: str  # the text between the op's parentheses: parameter(N)'s N
  attributes: str


@dataclasses.dataclass
class Kernel:
  """One launch (times ``count``: a loop body's kernels run once per trip)."""
  name: str
  kind: str  # "matmul", "attention", a fusion kind (kLoop, kInput) or the op
  bytes: int  # per launch
  flops: int  # per launch: matmuls and attention only
  op_name: str  # the JAX source op that made it (HLO metadata)
  shape: str  # its result
  count: int = 1


def computations(hlo: str) -> dict[str, list[Instruction]]:
  """The module's computations by name (the entry one as ``ENTRY``)."""
  found: dict[str, list[Instruction]] = {}
  current = None
  for line in hlo.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      head = line.split()
      name = "ENTRY" if head[0] == "ENTRY" else head[0]
      current = found.setdefault(name.lstrip("%"), [])
      continue
    match = _INSTRUCTION.match(line)
    if match and current is not None:
      name, shape, op, operands, attributes = match.groups()
      current.append(Instruction(name, shape, op, tuple(_OPERAND.findall(operands)),
                                 operands, attributes or ""))
  if "ENTRY" not in found:
    raise ValueError("no ENTRY computation: pass a compiled module's as_text()")
  return found


def _attribute(inst: Instruction, key: str) -> str | None:
  match = re.search(rf'{key}=(?:%)?("[^"]*"|{{[^}}]*}}|[^,\s]+)', inst.attributes)
  return match.group(1).strip('"') if match else None


# Ops that update their first operand's buffer in place, and which operand
# holds the update: only the update is read and written.
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}


def _fusion_bytes(inst: Instruction, shapes: dict[str, str],
                  body: list[Instruction]) -> int:
  """A fusion's operands and result, sliced operands at their slices' size
  and a root that updates a buffer in place at the update's."""
  users = collections.defaultdict(list)
  for i in body:
    for o in i.operands:
      users[o].append(i)
  root = next((i for i in body if not users.get(i.name) and i.op != "parameter"),
              None)
  in_place = root.operands[0] if root is not None and root.op in _IN_PLACE else None
  read = 0
  for i in body:
    if i.op != "parameter" or i.name == in_place:
      continue
    whole = shapes.get(inst.operands[int(i.args)], "")
    elements = _sliced_elements(i.name, users)
    if elements is None:
      read += shape_bytes(whole)
    else:
      read += elements * _WIDTH[_dims(whole)[0][0]] if _dims(whole) else 0
  if in_place is not None:
    update = root.operands[_IN_PLACE[root.op]]
    return read + shape_bytes(next(i.shape for i in body if i.name == update))
  return read + shape_bytes(inst.shape)


def _sliced_elements(name: str, users: dict[str, list[Instruction]]) -> int | None:
  """Elements of ``name`` a fusion reads when every use of it is a slice or
  a gather (through bitcasts and converts): the slices' sizes; None when
  some use reads it whole."""
  uses = users.get(name, [])
  if not uses:
    return None
  total = 0
  for u in uses:
    if u.op in _SLICES and u.operands[0] == name:
      total += sum(math.prod(d) for _, d in _dims(u.shape))
    elif u.op in _PASS_THROUGH:
      inner = _sliced_elements(u.name, users)
      if inner is None:
        return None
      total += inner
    else:
      return None
  return total


def _plain_bytes(inst: Instruction, shapes: dict[str, str]) -> int:
  """An unfused op's operands and result (in-place updates: the update's)."""
  if inst.op in _IN_PLACE:
    operands = inst.operands[1:]
    written = shapes.get(inst.operands[_IN_PLACE[inst.op]], "")
  else:
    operands, written = inst.operands, inst.shape
  return sum(shape_bytes(shapes.get(o, "")) for o in operands) + shape_bytes(written)


def _dot_flops(inst: Instruction, shapes: dict[str, str]) -> int:
  """2 x result elements x contracted size of a dot, or of a cuBLAS call
  (whose dimension numbers are in its backend config)."""
  contracting = _attribute(inst, "lhs_contracting_dims")
  if contracting is None:
    config = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', inst.attributes)
    contracting = config.group(1) if config else None
  lhs = _dims(shapes.get(inst.operands[0], "")) if inst.operands else []
  if contracting is None or not lhs:
    return 0
  k = math.prod(lhs[0][1][int(c)] for c in re.findall(r"\d+", contracting))
  return 2 * math.prod(_dims(inst.shape)[0][1]) * k


def _fused_dot_flops(body: list[Instruction]) -> int:
  shapes = {i.name: i.shape for i in body}
  return sum(_dot_flops(i, shapes) for i in body if i.op == "dot")


def _attention_flops(inst: Instruction, shapes: dict[str, str]) -> int:
  """A fused attention call's FLOPs from its query and key shapes, [B,
  T, H, d] as XLA's cuDNN calls take them: 4 B H Tq Tk d forward, 2.5 times
  that backward, halved under a causal mask."""
  q, k = (_dims(shapes.get(o, "")) for o in inst.operands[:2])
  if not q or not k or len(q[0][1]) != 4:
    return 0
  flops = 4 * math.prod(q[0][1]) * k[0][1][1]
  if "Backward" in inst.attributes:
    flops = flops * 5 // 2
  if '"mask_type":"CAUSAL"' in inst.attributes.replace(" ", ""):
    flops //= 2
  return flops


def kernels(hlo: str) -> list[Kernel]:
  """Every launch of the compiled module ``hlo`` (``compiled.as_text()``)."""
  comps = computations(hlo)
  found: list[Kernel] = []

  def walk(name: str, count: int) -> None:
    body = comps[name]
    shapes = {i.name: i.shape for i in body}
    for inst in body:
      if inst.op in _FREE:
        continue
      if inst.op == "while":
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attributes)
        walk(_attribute(inst, "body"), count * (int(trips.group(1)) if trips else 1))
        continue
      op_name = re.search(r'op_name="([^"]*)"', inst.attributes)
      op_name = op_name.group(1) if op_name else ""
      target = re.search(r'custom_call_target="([^"]+)"', inst.attributes)
      called = _attribute(inst, "calls")
      flops = 0
      if target and "fmha" in target.group(1):
        kind, flops = "attention", _attention_flops(inst, shapes)
      elif called in comps and inst.op == "fusion":
        flops = _fused_dot_flops(comps[called])
        kind = "matmul" if flops else (_attribute(inst, "kind") or "fusion")
      elif inst.op == "dot" or (target and re.search("gemm|matmul", target.group(1))):
        kind, flops = "matmul", _dot_flops(inst, shapes)
      else:
        kind = target.group(1) if target else inst.op
      if inst.op == "fusion" and called in comps:
        size = _fusion_bytes(inst, shapes, comps[called])
      else:
        size = _plain_bytes(inst, shapes)
      found.append(Kernel(inst.name, kind, size, flops, op_name,
                          inst.shape.split("{")[0], count))

  walk("ENTRY", 1)
  return found


# Model parts, by the first of these found in a kernel's op name: the
# loss's (its chunks run in a loop, a closed call), the model's parts by
# their module names, then what only the optimizer makes.
_PARTS = (("closed_call", "loss"), ("LMHead", "loss"), ("cross_entropy", "loss"),
          ("norm/", "norms"), ("ropout", "dropout"), ("attention", "attention"),
          ("mlp", "mlp"), ("embedder", "embedding"),
          ("_sublayer/add", "residual adds"), ("select_n", "optimizer"),
          ("adam", "optimizer"), ("optax", "optimizer"))


# Kernels whose kind names their part, whatever made them.
_KIND_PARTS = {"matmul": "matmuls", "attention": "attention (fused)"}


def part(kernel: Kernel) -> str:
  """Which part of a train step a kernel belongs to, by its op name."""
  if kernel.kind in _KIND_PARTS:
    return _KIND_PARTS[kernel.kind]
  for key, name in _PARTS:
    if key in kernel.op_name:
      return name
  return "optimizer and other"


@dataclasses.dataclass(frozen=True)
class Device:
  """What a kernel's time is estimated from."""
  bandwidth: float  # bytes/s a memory-bound kernel reaches
  matmul_flops: float  # FLOP/s a large bf16 matmul reaches
  attention_flops: float  # FLOP/s fused attention reaches


# Rates measured kernels reach, not data-sheet peaks: an H100 SXM's
# matmuls ran at about 800 TFLOP/s in jaxtl's profiles (989 peak), and
# elementwise kernels near 3.0 of its 3.35 TB/s (bf16 steps).
H100 = Device(bandwidth=3.0e12, matmul_flops=750e12,
              attention_flops=450e12)


def seconds(kernel: Kernel, device: Device) -> float:
  """One launch's time: the slower of its bytes and its FLOPs."""
  rate = device.attention_flops if kernel.kind == "attention" else device.matmul_flops
  return max(kernel.bytes / device.bandwidth, kernel.flops / rate)


def by_part(found: Iterable[Kernel], device: Device) -> list[dict[str, str]]:
  """Rows (part, kernels, GB, TFLOP, estimated ms), largest first."""
  totals = collections.defaultdict(lambda: [0, 0, 0, 0.0])
  for k in found:
    t = totals[part(k)]
    t[0] += k.count
    t[1] += k.bytes * k.count
    t[2] += k.flops * k.count
    t[3] += seconds(k, device) * k.count
  rows = [{"part": name, "kernels": str(n), "GB": f"{b / 1e9:.2f}",
           "TFLOP": f"{f / 1e12:.2f}", "est. ms": f"{s * 1e3:.2f}"}
          for name, (n, b, f, s) in sorted(totals.items(), key=lambda kv: -kv[1][3])]
  n, b, f, s = (sum(t[i] for t in totals.values()) for i in range(4))
  rows.append({"part": "**step**", "kernels": str(n), "GB": f"{b / 1e9:.2f}",
               "TFLOP": f"{f / 1e12:.2f}", "est. ms": f"{s * 1e3:.2f}"})
  return rows


def heaviest(found: Iterable[Kernel], device: Device, top: int) -> list[dict[str, str]]:
  """The ``top`` kernels (alike ones merged: same part, result and op) by time."""
  merged: dict[tuple[str, str, str], list] = {}
  for k in found:
    op = re.sub(r"layer_\d+", "layer_N", k.op_name)
    key = (part(k), k.shape, op)
    entry = merged.setdefault(key, [0, 0, 0.0])
    entry[0] += k.count
    entry[1] += k.bytes * k.count
    entry[2] += seconds(k, device) * k.count
  rows = sorted(merged.items(), key=lambda kv: -kv[1][2])[:top]
  return [{"part": p, "kernels": str(n), "GB": f"{b / 1e9:.2f}", "est. ms": f"{s * 1e3:.2f}",
           "result": f"`{shape}`", "op": f"`{op[-80:]}`"}
          for (p, shape, op), (n, b, s) in rows]
