"""What a model's training needs besides FLOPs: device memory and host input.

``state_bytes_per_device``: parameter + optimizer bytes on the fullest device
under a (data, fsdp, tensor) mesh, from the shardings the state is created
with. ``pipeline_rows``: tokens/s of a recipe's host input pipeline. Both
feed ``jaxtl benchmark --memory`` / ``--pipeline``.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import psutil

from jaxtl.train import optim, sharding
from jaxtl import layout, train
from jaxtl.tools.presets import (PRESETS, Preset, init_inputs, jaxtl_step, make_batch,
                                 model_config, optimizer_config)
from jaxtl.models import TransformerConfig
from jaxtl.pretraining import config as pretrain_config
from jaxtl.pretraining import pipeline

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
  """(result, wall seconds, CPU seconds of this process's threads and of its
  child processes, Grain's workers included)."""
  me = psutil.Process()

  def cpu() -> float:
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
      try:
        total += sum(child.cpu_times()[:2])
      except psutil.NoSuchProcess:
        pass
    return total

  wall, start = time.perf_counter(), cpu()
  out = fn()
  return out, time.perf_counter() - wall, cpu() - start


def pipeline_rows(recipe: str, workdir: str, max_docs: int = 5000,
                  batches: int = 100, workers: tuple[int, ...] = (0, 1, 2),
                  overrides: tuple[str, ...] = ()) -> list[dict[str, str]]:
  """Host throughput of a pretraining recipe's input pipeline, in two stages.

  ``tokenize + pack``: streaming the train and eval documents, tokenizing
  and cutting or packing them into rows on disk (what ``DataSetup`` does
  once per corpus and tokenizer). ``objective``: the per-batch work (reading
  rows, masking, span corruption, batching) with each number of Grain
  ``workers``, in the tokens of the batches it hands the step. tokens/s per
  core divides by the CPU seconds of the process and its workers, so it
  holds however many threads or processes did the work. ``overrides``
  (``data.seq_len=512``, ...) set config keys, e.g. to a benchmark preset's
  shape, so the figure compares with the step that would consume it.
  """
  module, _, arg = recipe.partition(":")
  config = importlib.import_module(f"jaxtl.configs.{module}").get_config(arg or None)
  config.data.update(max_docs=max_docs, cache=False)
  for item in overrides:
    set_config_key(config, item)
  typed = pretrain_config.of(config)
  pipeline.DataSetup(typed, workdir)  # trains and saves the tokenizer: untimed
  data, wall, cpu = _timed(lambda: pipeline.DataSetup(typed, workdir))
  tokens = sum(data.num_tokens(s) for s in (data.train_split, data.eval_split))
  # A few fast batches can take less CPU time than psutil's clock tick.
  fmt = lambda n, s: f"{n / s:,.0f}" if s > 0 else "n/a (too fast to time)"
  rows = [{"recipe": recipe, "stage": "tokenize + pack", "tokens": f"{tokens:,}",
           "tokens/s": fmt(tokens, wall), "tokens/s per core": fmt(tokens, cpu)}]
  b_tokens = batches * data.batch_size * sum(data.lengths.values())
  for n in workers:
    it = data.train_iterator()
    it.workers = n
    next(it)  # workers started
    _, b_wall, b_cpu = _timed(lambda: [next(it) for _ in range(batches)])
    it.close()
    rows.append({"recipe": recipe, "stage": f"objective, {n} Grain workers",
                 "tokens": f"{b_tokens:,}", "tokens/s": fmt(b_tokens, b_wall),
                 "tokens/s per core": fmt(b_tokens, b_cpu)})
  return rows


def set_config_key(config: ml_collections.ConfigDict, item: str) -> None:
  """Applies ``"a.b=value"`` to a ConfigDict, typed by the value it replaces
  (as ``--config.a.b=value`` would be on the command line)."""
  key, sep, value = item.partition("=")
  *path, last = key.split(".")
  node = config
  try:
    for part in path:
      node = node[part]
    old = node[last]
  except (KeyError, TypeError):
    raise ValueError(f"config override {item!r}: no key {key!r} in the recipe's config") from None
  if not sep or isinstance(old, (dict, list, tuple)) or hasattr(old, "keys"):
    raise ValueError(f"config override {item!r}: expected KEY=VALUE with KEY a "
                     "scalar of the recipe's config")
  if isinstance(old, bool):
    node[last] = value.lower() in ("1", "true", "yes")
  else:
    node[last] = value if old is None else type(old)(value)


_RSS_CONFIG = """# Written by jaxtl.tools.footprint.corpus_rss_rows.
import importlib

def get_config(arg=None):
  c = importlib.import_module("jaxtl.configs.{module}").get_config({arg!r})
  files = c.data.source.files
  files.train = tuple(files.train if isinstance(files.train, (list, tuple))
                      else [files.train]) * {repeats}
  c.data.tokenizer.path = {tokenizer!r}
  c.train.update(steps={steps}, eval_every={steps}, log_every={steps},
                 checkpoint_every={steps}, eval_batches=2)
  return c
"""


def corpus_rss_rows(recipe: str, workdir: str, repeats: tuple[int, ...] = (1, 10),
                    steps: int = 20, tokenizer: str = "") -> list[dict[str, str]]:
  """Peak host memory of a pretraining run as its corpus grows.

  Each run is ``jaxtl pretrain`` on the recipe with its train files
  listed ``r`` times (the corpus repeated), for ``steps`` steps, in a fresh
  workdir, so it streams, tokenizes and packs the whole corpus and then
  trains. ``tokenizer`` (a .model file; default: one the first run trains)
  keeps sentencepiece training out of the comparison. The peak is the
  largest resident set of the run's processes (``ru_maxrss`` of children).
  """
  module, _, arg = recipe.partition(":")
  rows = []
  for r in repeats:
    run_dir = os.path.join(workdir, f"rss_{module}_x{r}")
    os.makedirs(run_dir, exist_ok=True)
    config_file = os.path.join(run_dir, "config.py")
    run_workdir = os.path.join(run_dir, "workdir")
    with open(config_file, "w") as f:
      f.write(_RSS_CONFIG.format(module=module, arg=arg or None, repeats=r,
                                 tokenizer=tokenizer, steps=steps))
    start = time.perf_counter()
    # A fresh process per run: ru_maxrss of children is the largest so far.
    out = subprocess.run(
        [sys.executable, "-c",
         "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
         sys.executable, "-m", "jaxtl.programs.train", f"--config={config_file}",
         f"--workdir={run_workdir}"],
        check=True, capture_output=True, text=True)
    peak_kib = int(out.stdout.strip().splitlines()[-1])
    wall = time.perf_counter() - start
    if not tokenizer:  # the next runs reuse the one this run trained
      tokenizer = _tokenizer_file(layout.tokenizer_dir(run_workdir))
    meta = _train_rows_meta(run_workdir)
    rows.append({"recipe": recipe, "corpus": f"x{r}",
                 "train documents": f"{meta['documents']:,}",
                 "train tokens": f"{meta['tokens']:,}", "steps": str(steps),
                 "wall s": f"{wall:.0f}", "peak RSS": f"{peak_kib / 1024:,.0f} MiB"})
  return rows


def _tokenizer_file(folder: str) -> str:
  models = sorted(glob.glob(f"{folder}/*.model"))
  return models[0] if models else folder


def _train_rows_meta(workdir: str) -> dict[str, Any]:
  """The largest row store's metadata in a run's data cache (its train split)."""
  metas = []
  for path in glob.glob(f"{layout.data_cache(workdir)}/rows_*.json"):
    with open(path) as f:
      metas.append(json.load(f))
  return max(metas, key=lambda m: m["tokens"])
