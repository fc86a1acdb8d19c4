"""What a model's training needs besides FLOPs: device memory and host input.

``state_bytes_per_device``: parameter + optimizer bytes on the fullest device
under a (data, fsdp, tensor) mesh, from the shardings the state is created
with. ``pipeline_rows``: tokens/s of a recipe's host input pipeline. Both
feed ``python -m jaxtl.tools.benchmark --memory`` / ``--pipeline``.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxtl.train import optim, sharding
from jaxtl import train
from jaxtl.tools.presets import (PRESETS, Preset, init_inputs, jaxtl_step, make_batch,
                                 model_config, optimizer_config)
from jaxtl.models import TransformerConfig

# ----------------------------------------------------------------------------
# Memory per device under each mesh.

MEMORY_MESHES = ((1, 1, 1), (8, 1, 1), (1, 8, 1), (1, 4, 2))


def state_bytes_per_device(preset: Preset, cfg: TransformerConfig,
                           mesh_shape: tuple[int, int, int],
                           devices: list[jax.Device] | None = None) -> int:
  """Parameter + optimizer bytes on the fullest device under ``mesh_shape``.

  Computed from the shardings the train state is created with (the shards
  ``create_sharded_state`` allocates), so no device memory is needed.
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  devices = list(devices or jax.devices())[:int(np.prod(mesh_shape))]
  mesh, rules = sharding.make_mesh(mesh_shape, devices), sharding.make_rules()
  model, _, _ = jaxtl_step(preset, cfg)
  tx, _ = optim.make_optimizer(optimizer_config(), total_steps=1)
  batch = make_batch(dataclasses.replace(preset, batch_size=1))
  abstract, shardings = train.abstract_sharded_state(
      model, tx, init_inputs(model, preset, batch), jax.random.key(0), mesh, rules)
  per_device = dict.fromkeys(devices, 0)

  def add(x, s):
    for device, index in s.devices_indices_map(x.shape).items():
      shard = [len(range(*i.indices(n))) for i, n in zip(index, x.shape)]
      per_device[device] += int(np.prod(shard)) * x.dtype.itemsize

  jax.tree.map(add, nn.unbox(abstract), shardings)
  return max(per_device.values())


def memory_rows(names: list[str], dtype: str = "float32",
                meshes: tuple[tuple[int, int, int], ...] = MEMORY_MESHES
                ) -> list[dict[str, str]]:
  """Per-device state MiB of each preset under each (data, fsdp, tensor) mesh."""
  rows = []
  for name in names:
    preset = PRESETS[name]
    cfg = model_config(preset, dtype)
    sizes = {m: state_bytes_per_device(preset, cfg, m) for m in meshes}
    one = sizes[(1, 1, 1)]
    rows.append({"preset": name, **{
        str(m): f"{sizes[m] / 2**20:,.1f} MiB (÷{one / sizes[m]:.2f})" for m in meshes}})
  return rows


# ----------------------------------------------------------------------------
# The host input pipeline.


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
  """(result, wall seconds, CPU seconds of every thread of this process)."""
  wall, cpu = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - wall, time.process_time() - cpu


def pipeline_rows(recipe: str, workdir: str, max_docs: int = 5000,
                  batches: int = 100) -> list[dict[str, str]]:
  """Host throughput of a pretraining recipe's input pipeline, in two stages.

  ``tokenize + pack``: reading the train and eval documents, tokenizing and
  cutting or packing them into rows (what ``DataSetup`` does once per run,
  or once per cache). ``objective``: the per-batch work on the prefetch
  thread (masking, span corruption, shuffling, batching), in the tokens of
  the batches it hands the step. tokens/s per core divides by the process's
  CPU seconds, so it holds however many threads a library used.
  """
  from jaxtl.data import pipeline  # pylint: disable=g-import-not-at-top
  module, _, arg = recipe.partition(":")
  config = importlib.import_module(f"jaxtl.configs.{module}").get_config(arg or None)
  config.data.update(max_docs=max_docs, cache=False)
  pipeline.DataSetup(config, workdir)  # trains and saves the tokenizer: untimed
  data, wall, cpu = _timed(lambda: pipeline.DataSetup(config, workdir))
  tokens = sum(data.num_tokens(s) for s in (data.train_split, data.eval_split))
  it = data.train_iterator()
  next(it)
  _, b_wall, b_cpu = _timed(lambda: [next(it) for _ in range(batches)])
  b_tokens = batches * data.batch_size * sum(data.lengths.values())
  fmt = lambda n, s: f"{n / s:,.0f}"
  return [{"recipe": recipe, "stage": "tokenize + pack", "tokens": f"{tokens:,}",
           "tokens/s": fmt(tokens, wall), "tokens/s per core": fmt(tokens, cpu)},
          {"recipe": recipe, "stage": "objective (per batch)", "tokens": f"{b_tokens:,}",
           "tokens/s": fmt(b_tokens, b_wall), "tokens/s per core": fmt(b_tokens, b_cpu)}]
