r"""Where a preset's train step spends an H100's memory bandwidth, compiled
here, without a GPU (issue 31: prepare on the CPU, confirm on the device).

Once, the CUDA plugin of the installed jax into a folder of its own (about
5 GB; nothing is installed into the environment):

  V=$(python -c 'import jax; print(jax.__version__)')
  pip install --no-deps --target .gpu_aot jax-cuda12-plugin==$V jax-cuda12-pjrt==$V \
    nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12 nvidia-cublas-cu12 \
    nvidia-cuda-cupti-cu12 'nvidia-cudnn-cu12<10' nvidia-nvjitlink-cu12 \
    nvidia-cuda-nvrtc-cu12 nvidia-cufft-cu12 nvidia-cusolver-cu12 \
    nvidia-cusparse-cu12 nvidia-nccl-cu12 nvidia-nvshmem-cu12

Then, per preset (batch: the preset's accelerator batch):

  PYTHONPATH=.gpu_aot python launch/gpu_traffic.py --presets=gpt2_small \
    --model=attention_dropout_rate=0.0 [--commit=REV] [--hlo_dir=/tmp/hlo]

XLA compiles jaxtl's real train step for an H100 from a description of the
device, with the model taking its GPU paths (cuDNN attention, bf16, the
select guard) as it would on one. No device means no autotuning: matmuls
keep Triton's default tiles, so their time is estimated from FLOPs, and
every other kernel's from its bytes (:mod:`jaxtl.tools.hlo_traffic`).
Prints each part's kernels, bytes and estimated time, then the heaviest
kernels. Estimates rank changes before device time confirms them; they are
not measurements.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CUDA plugin only compiles
os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"  # it would look for a GPU

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
from absl import app, flags  # noqa: E402

flags.DEFINE_list("presets", ["gpt2_small"], "Benchmark presets to compile.")
flags.DEFINE_integer("batch_size", 0, "Rows per step (0: the preset's accelerator batch).")
flags.DEFINE_list("model", [], "TransformerConfig overrides, as jaxtl benchmark's --model.")
flags.DEFINE_integer("top", 15, "Heaviest kernels listed per preset (0: none).",
                     lower_bound=0)
flags.DEFINE_string("hlo_dir", "", "Where to write each compiled step's HLO text.")
flags.DEFINE_string("commit", "", "Also compile the step as this commit builds it and "
                    "print both side by side: a change's effect before device time.")
FLAGS = flags.FLAGS

# An H100 SXM 80GB as XLA's GPU compiler reads a device (GpuTargetConfigProto).
H100_SXM = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32
  shared_memory_per_block: 49152 shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472 threads_per_core_limit: 2048
  core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 84978434048
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
  cuda_compute_capability { major: 9 minor: 0 }
}
platform_name: "CUDA"
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def gpu_devices() -> list:
  """Compile-only H100 devices, or exit with the one line that fixes it."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    return topologies.get_topology_desc("h100", platform="cuda", target_config=H100_SXM,
                                        topology="1x1x1").devices
  except (NotImplementedError, RuntimeError) as e:
    sys.exit(f"gpu_traffic: no CUDA compiler ({e}); install the plugin into .gpu_aot "
             "and run with PYTHONPATH=.gpu_aot (see this script's docstring)")


def compile_step(bench, name: str, devices: list) -> tuple[str, str]:
  """(HLO text, heading) of preset ``name``'s train step compiled for
  ``devices``, built by ``bench`` (a ``jaxtl.tools.benchmark`` module: this
  checkout's or a commit's, whose own model, loss and step it uses)."""
  preset = bench.lookup([name])[0]
  preset = dataclasses.replace(preset, batch_size=FLAGS.batch_size
                               or preset.accelerator_batch_size or preset.batch_size)
  cfg = bench.model_config(preset, "bfloat16", **bench.parse_overrides(FLAGS.model))
  mesh, rules = bench.sharding.make_mesh((-1, 1, 1), devices), bench.sharding.make_rules()
  model, loss_fn, weight_fn = bench.jaxtl_step(preset, cfg)
  batch = bench.make_batch(preset)
  tx, schedule = bench.optim.make_optimizer(bench.optimizer_config(), total_steps=1000)
  abstract, shardings = bench.train.abstract_sharded_state(
      model, tx, bench.init_inputs(model, preset, batch), jax.random.key(0), mesh, rules)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       nn.unbox(abstract), shardings)
  rows = bench.sharding.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rows) for k, v in batch.items()}
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                             sharding=bench.sharding.replicated(mesh))
  step = bench.train.jit_train_step(loss_fn, weight_fn, tx, shardings, mesh)
  start = time.perf_counter()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    hlo = step.lower(state, batch, rng, schedule).compile().as_text()
  return hlo, (f"{name}, {preset.batch_size} x {preset.length}, bf16 (compiled for an "
               f"H100 in {time.perf_counter() - start:.1f} s)")


def side_by_side(theirs: list[dict[str, str]], ours: list[dict[str, str]],
                 label: str) -> list[dict[str, str]]:
  """Two ``by_part`` tables as one: each part's GB and time, then and now."""
  then = {r["part"]: r for r in theirs}
  now = {r["part"]: r for r in ours}
  parts = [r["part"] for r in ours] + [p for p in then if p not in now]
  blank = {"GB": "-", "est. ms": "-"}
  return [{"part": p, f"GB ({label})": then.get(p, blank)["GB"], "GB": now.get(p, blank)["GB"],
           f"est. ms ({label})": then.get(p, blank)["est. ms"],
           "est. ms": now.get(p, blank)["est. ms"]} for p in parts]


def save(filename: str, hlo: str) -> None:
  """Writes ``hlo`` into --hlo_dir, if one was given."""
  if FLAGS.hlo_dir:
    os.makedirs(FLAGS.hlo_dir, exist_ok=True)
    with open(os.path.join(FLAGS.hlo_dir, filename), "w", encoding="utf-8") as f:
      f.write(hlo)


def main(argv: list[str]) -> None:
  del argv
  devices = gpu_devices()
  # The model and the step choose their GPU paths by the default backend.
  jax.default_backend = lambda: "gpu"
  from jaxtl.tools import benchmark, hlo_traffic, other_checkout  # pylint: disable=import-outside-toplevel
  for name in FLAGS.presets:
    hlo, heading = compile_step(benchmark, name, devices)
    print(f"\n## {heading}\n")
    save(f"{name}.hlo", hlo)
    found = hlo_traffic.kernels(hlo)
    parts = hlo_traffic.by_part(found, hlo_traffic.H100)
    if FLAGS.commit:
      with other_checkout.commit_tree(FLAGS.commit) as tree, \
          other_checkout.imported(tree) as theirs:
        old_hlo, _ = compile_step(theirs, name, devices)
      save(f"{name}.{FLAGS.commit}.hlo", old_hlo)
      parts = side_by_side(hlo_traffic.by_part(hlo_traffic.kernels(old_hlo), hlo_traffic.H100),
                           parts, FLAGS.commit)
    print(benchmark.markdown(parts))
    if FLAGS.top:
      print()
      print(benchmark.markdown(hlo_traffic.heaviest(found, hlo_traffic.H100, FLAGS.top)))


if __name__ == "__main__":
  app.run(main)
