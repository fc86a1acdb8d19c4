"""Name-and-layout rules between Hugging Face tensors and jaxtl parameters.

One table per family lists, for every tensor, its Hugging Face name, its
jaxtl path and how the layout differs; import and export both read the same
table, so the two directions cannot drift apart.

Layouts: PyTorch ``nn.Linear`` stores ``[out, in]`` (``linear``, transposed
here); GPT-2's ``Conv1D`` stores ``[in, out]`` like Flax (``conv1d``).
jaxtl keeps attention kernels per head (``[D, H, K]`` and ``[H, K, D]``), so
``n_in`` says how many leading jaxtl axes flatten into the HF input axis.
A fused HF tensor (GPT-2's ``c_attn``: q, k and v side by side) appears as
several rules with ``part=(i, n)``: slice i of n along the output axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from jaxtl.models import paths

KINDS = ("copy", "vector", "row", "linear", "conv1d")


@dataclasses.dataclass(frozen=True)
class Rule:
  """One HF tensor (or one part of it) <-> one jaxtl parameter.

  Attributes:
    hf: The HF name, without the architecture's base prefix (``bert.``).
    jax: The jaxtl path (:mod:`jaxtl.models.paths`); ``head/...`` is a
      task-head parameter, anything else belongs to the backbone.
    kind: ``copy`` (same layout), ``vector`` (1-D in HF, any shape here),
      ``row`` ([1, N] in HF, [N] here: BART's ``final_logits_bias``),
      ``linear`` (transposed) or ``conv1d`` (reshaped only).
    group: Rules are loaded group by group: ``base`` must be complete; any
      other group (``mlm``, ``pooler``, ...) is all there or all absent.
    n_in: Leading jaxtl axes that form the HF input axis.
    part: ``(i, n)`` for slice i of n of a fused HF tensor's output axis.
    skip_rows: ``copy`` only: leading HF rows jaxtl never reads (RoBERTa's
      position table starts at padding_idx + 1, BART's at row 2); dropped on
      import, written as zeros on export.
  """
  hf: str
  jax: str
  kind: str
  group: str = "base"
  n_in: int = 1
  part: tuple[int, int] | None = None
  skip_rows: int = 0

  def hf_shape(self, jax_shape: Sequence[int]) -> tuple[int, ...]:
    """The HF shape (of the whole fused tensor) for a jaxtl shape."""
    if self.kind == "copy":
      return (jax_shape[0] + self.skip_rows, *jax_shape[1:])
    if self.kind == "row":
      return (1, math.prod(jax_shape))
    if self.kind == "vector":
      shape = (math.prod(jax_shape),)
    else:
      shape = (math.prod(jax_shape[:self.n_in]), math.prod(jax_shape[self.n_in:]))
    if self.part:
      shape = (*shape[:-1], shape[-1] * self.part[1])
    return shape[::-1] if self.kind == "linear" else shape

  def to_jax(self, hf_value: np.ndarray, jax_shape: Sequence[int]) -> np.ndarray:
    x = hf_value.T if self.kind == "linear" else hf_value[self.skip_rows:]
    if self.part:
      x = np.split(x, self.part[1], axis=-1)[self.part[0]]
    return np.ascontiguousarray(x.reshape(jax_shape))

  def to_hf(self, value: np.ndarray) -> np.ndarray:
    """The HF layout of ``value`` (only this rule's slice when ``part``)."""
    if self.kind == "copy":
      return np.pad(value, [(self.skip_rows, 0)] + [(0, 0)] * (value.ndim - 1))
    if self.kind == "row":
      return value.reshape(1, -1)
    if self.kind == "vector":
      return value.reshape(-1)
    x = value.reshape(math.prod(value.shape[:self.n_in]), -1)
    return x.T if self.kind == "linear" else x


def attention_rules(hf_prefix: str, jax_prefix: str, names: Mapping[str, str], *,
                    bias: bool, group: str = "base") -> list[Rule]:
  """q, k, v and output projections stored as separate ``nn.Linear`` s.

  ``names`` maps jaxtl's ``paths.PROJECTIONS`` to the HF module names.
  """
  rules = []
  for ours, theirs in names.items():
    hf, projection = f"{hf_prefix}.{theirs}", paths.join(jax_prefix, ours)
    n_in = 2 if ours == paths.OUT else 1
    rules.append(Rule(f"{hf}.weight", paths.kernel(projection), "linear", group, n_in))
    if bias:
      rules.append(Rule(f"{hf}.bias", paths.bias(projection), "vector", group))
  return rules


def norm_rules(hf_prefix: str, jax_prefix: str, *, bias: bool,
               group: str = "base") -> list[Rule]:
  """A LayerNorm (weight, bias) or an RMSNorm (weight only)."""
  weight = Rule(f"{hf_prefix}.weight", paths.join(jax_prefix, paths.SCALE), "vector",
                group)
  return _with_bias(weight, hf_prefix, jax_prefix, bias)


def dense_rules(hf_prefix: str, jax_prefix: str, *, bias: bool, kind: str = "linear",
                group: str = "base") -> list[Rule]:
  """A dense layer: ``kernel`` (+ ``bias``) under ``jax_prefix``."""
  kernel = Rule(f"{hf_prefix}.weight", paths.join(jax_prefix, paths.KERNEL), kind, group)
  return _with_bias(kernel, hf_prefix, jax_prefix, bias)


def _with_bias(weight: Rule, hf_prefix: str, jax_prefix: str, bias: bool) -> list[Rule]:
  """``weight``'s rule and, with ``bias``, the one of the bias vector beside it."""
  if not bias:
    return [weight]
  return [weight, Rule(f"{hf_prefix}.bias", paths.join(jax_prefix, paths.BIAS), "vector",
                       weight.group)]


def _describe(names: Iterable[str], limit: int = 20) -> str:
  names = sorted(names)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def load(rules: Sequence[Rule], tensors: Mapping[str, np.ndarray],
         shapes: Mapping[str, Sequence[int]], source: str
         ) -> tuple[dict[str, np.ndarray], list[str]]:
  """jaxtl parameters from HF tensors by ``rules``; returns (flat params, groups).

  ``shapes`` gives the jaxtl shape of every path a rule names. Every HF
  tensor must be claimed by a rule; the ``base`` group must be complete and
  the others all-or-nothing. Errors list every offending name at once.
  """
  groups: dict[str, list[Rule]] = {}
  for r in rules:
    groups.setdefault(r.group, []).append(r)
  missing, loaded_groups = [], []
  for group, members in groups.items():
    absent = [r.hf for r in members if r.hf not in tensors]
    if group == "base" or len(absent) < len(members):
      missing += absent
      loaded_groups.append(group)
  unknown = set(tensors) - {r.hf for r in rules}
  problems = []
  if missing:
    problems.append(f"missing tensors: {_describe(set(missing))}")
  if unknown:
    problems.append(f"unexpected tensors: {_describe(unknown)}")
  bad_shapes = [f"{r.hf}: expected {r.hf_shape(shapes[r.jax])}, found "
                f"{tuple(tensors[r.hf].shape)}"
                for g in loaded_groups for r in groups[g]
                if r.hf in tensors and tuple(tensors[r.hf].shape) != r.hf_shape(shapes[r.jax])]
  if bad_shapes:
    problems.append("shape mismatches:\n    " + "\n    ".join(bad_shapes))
  if problems:
    raise ValueError(f"{source}: the checkpoint does not match its config:\n  "
                     + "\n  ".join(problems))
  params = {r.jax: r.to_jax(np.asarray(tensors[r.hf]), shapes[r.jax])
            for g in loaded_groups for r in groups[g]}
  return params, loaded_groups


def dump(rules: Sequence[Rule], params: Mapping[str, np.ndarray]
         ) -> dict[str, np.ndarray]:
  """HF tensors from flat jaxtl parameters; fused tensors are reassembled."""
  missing = [r.jax for r in rules if r.jax not in params]
  if missing:
    raise ValueError(f"cannot export: the parameters lack {_describe(missing)}")
  tensors: dict[str, np.ndarray] = {}
  parts: dict[str, list[tuple[int, np.ndarray]]] = {}
  axis = {}  # a fused tensor's output axis: first for nn.Linear, else last
  for r in rules:
    value = r.to_hf(np.asarray(params[r.jax], np.float32))
    if r.part:
      parts.setdefault(r.hf, []).append((r.part[0], value))
      axis[r.hf] = 0 if r.kind == "linear" else -1
    else:
      tensors[r.hf] = value
  for name, pieces in parts.items():
    tensors[name] = np.concatenate([v for _, v in sorted(pieces, key=lambda p: p[0])],
                                   axis=axis[name])
  return {k: np.ascontiguousarray(v) for k, v in tensors.items()}
