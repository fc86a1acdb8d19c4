"""Device mesh, logical-axis rules, and shardings for state and batches.

Models name their axes logically (``embed``, ``mlp``, ``heads`` ...); this
module is the only place that maps those names onto the three mesh axes:

  data    pure data parallelism (parameters replicated),
  fsdp    data parallelism with parameters and optimizer state sharded,
  tensor  Megatron-style tensor parallelism inside layers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxtl.sections import key

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

Rules = tuple[tuple[str, Any], ...]

# One table for the whole library. The first rule whose mesh axes are still
# free wins (flax semantics), so an axis is never used twice in one array.
DEFAULT_RULES: Rules = (
    ("batch", BATCH_AXES),
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
    ("positions", None),
    ("type_vocab", None),
    ("relpos_buckets", None),
    ("labels", None),  # task-head outputs
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The device mesh and the logical-axis rules."""
  shape: tuple[int, ...] = key((-1, 1, 1), "device mesh (data, fsdp, tensor); -1 takes "
                                           "the remaining devices")
  rules: dict[str, Any] = key({}, "mesh axes logical axis {name} is sharded over "
                                  "(overrides jaxtl.train.sharding.DEFAULT_RULES)")


def make_rules(overrides: Mapping[str, Any] | None = None) -> Rules:
  """DEFAULT_RULES with some logical names remapped (e.g. from the config)."""
  overrides = dict(overrides.items()) if overrides else {}
  unknown = set(overrides) - {name for name, _ in DEFAULT_RULES}
  if unknown:
    raise ValueError(f"unknown logical axes in sharding rules: {sorted(unknown)}")
  for name, axes in overrides.items():
    for axis in (axes,) if isinstance(axes, str) else (axes or ()):
      if axis not in MESH_AXES:
        raise ValueError(f"rule {name!r} -> {axes!r}: {axis!r} is not a mesh "
                         f"axis {MESH_AXES}")
  return tuple((name, overrides.get(name, axes)) for name, axes in DEFAULT_RULES)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None
              ) -> Mesh:
  """Mesh over axes (data, fsdp, tensor); one entry may be -1 (fill)."""
  devices = list(devices if devices is not None else jax.devices())
  shape = list(shape)
  if len(shape) != 3:
    raise ValueError(f"mesh shape must have 3 entries {MESH_AXES}, got {shape}")
  if shape.count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got {shape}")
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if len(devices) % known:
      raise ValueError(f"mesh {shape} does not divide {len(devices)} devices")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"mesh {tuple(shape)} needs {math.prod(shape)} devices, "
                     f"{len(devices)} available")
  # Auto axes: XLA's partitioner propagates shardings from the logical
  # annotations (explicit-sharding mode would turn them into assertions).
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=auto, devices=devices)


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for a tree whose leaves may be logically-boxed arrays.

  The result has the structure of the *unboxed* tree, which is what the
  jitted init returns.
  """
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_devices(mesh: Mesh) -> int:
  """How many devices ``mesh`` splits each batch over (its data and fsdp
  axes): every batch size must be a multiple of it."""
  return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over data and fsdp; the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def shard_whole_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """A batch every process holds whole -> global jax arrays, each device
  given its rows by their global index (so row i of the batch is row i of
  the array on any mesh, which :func:`gather` then keeps)."""
  sharding = batch_sharding(mesh)
  return {name: jax.make_array_from_callback(value.shape, sharding,
                                             lambda index, v=value: v[index])
          for name, value in batch.items()}


def gather(x: jax.Array) -> np.ndarray:
  """A batch-sharded output as one host array on every process, in global
  order (a multi-host array spans devices a process cannot read)."""
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def shard_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Host-local numpy batch -> global jax arrays (multi-process aware).

  Each process passes its own slice of the global batch; the global batch is
  ``process_count`` times larger along dimension 0.
  """
  sharding = batch_sharding(mesh)
  out = {}
  for name, value in batch.items():
    global_shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
    out[name] = jax.make_array_from_process_local_data(sharding, value,
                                                       global_shape)
  return out


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
