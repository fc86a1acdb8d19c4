r"""``jaxtl benchmark``: time the train step, with PyTorch side by side.

  jaxtl benchmark --presets=tiny_gpt2,tiny_bert,tiny_t5,tiny_cls --torch
  jaxtl benchmark --presets=gpt2_small,bert_base,t5_small,minilm_cls --torch
  jaxtl benchmark --presets=minilm_cls --torch --keras
  jaxtl benchmark --generate=1,32 --presets=gpt2_small --torch --steps=3
  jaxtl benchmark --presets=minilm_cls --dtype=float32 --versus=row_major_dots=true --rounds=8
  jaxtl benchmark --presets=minilm_cls --dtype=float32 --versus=cpu_rule=FLOAT32_FOLDED_DX_RULES --steps=1 --rounds=40
  jaxtl benchmark --presets=minilm_cls,gpt2_small --versus=commit=1d4cd75 --steps=1 --rounds=20

What is measured and how: :mod:`jaxtl.tools.benchmark`; generation:
:mod:`jaxtl.tools.benchmark_generate`.
"""

from __future__ import annotations

import os
import shlex
import sys

from absl import app, flags

from jaxtl import objectives
from jaxtl.tools import benchmark as bench
from jaxtl.tools import benchmark_generate, footprint
from jaxtl.tools.footprint import MEMORY_MESHES
from jaxtl.tools.presets import PRESETS
from jaxtl.tools.profiling import CPU_TRACE_FLAG

flags.DEFINE_list("presets", ["tiny_gpt2", "tiny_bert", "tiny_t5", "tiny_cls"],
                  f"Presets: {', '.join(PRESETS)}.")
flags.DEFINE_boolean("torch", False, "Also time transformers (PyTorch) side by side.")
flags.DEFINE_boolean("keras", False, "Also time KerasHub on the same JAX side by side "
                     "(pip install --no-deps keras-hub).")
flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.", lower_bound=0)
flags.DEFINE_integer("steps", 10, "Timed steps (the median is reported).", lower_bound=1)
flags.DEFINE_string("dtype", "auto", "Compute dtype; auto: what the recipes compute in "
                    "here (bfloat16 on accelerators and, with row-major dots, on CPUs "
                    "where bf16 matmuls pay; else float32).")
flags.DEFINE_integer("batch_size", 0, "Override every preset's batch size (0: the preset's; on "
                     "GPUs and TPUs its accelerator_batch_size per device).", lower_bound=0)
flags.DEFINE_integer("length", 0, "Override every preset's (input) sequence length "
                     "(0: keep).", lower_bound=0)
flags.DEFINE_integer("devices", 0, "Devices jaxtl runs on, data parallel (0: all). "
                     "PyTorch always runs on one: compare at --devices=1.", lower_bound=0)
flags.DEFINE_list("model", [], "TransformerConfig overrides, e.g. remat=full,scan_layers=true.")
flags.DEFINE_list("versus", [], "TransformerConfig overrides (like --model), XLA "
                  "options (xla_NAME=VALUE, enums by their full names, e.g. "
                  "xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT) and "
                  "cpu_rule=TABLE (this CPU put into, or taken out of, that rule table "
                  "of jaxtl.runtime.xla_cpu, e.g. FLOAT32_FOLDED_DX_RULES) for a "
                  "second step, or commit=REV (this git repository's jaxtl at that "
                  "commit) or tree=PATH (another checkout) alone for the step as that "
                  "code builds it; compiled in the same process and timed against the "
                  "first in alternating rounds: a change's effect, on a host whose runs "
                  "vary.")
flags.DEFINE_integer("rounds", 6, "--versus, and --torch on a CPU: rounds of --steps steps "
                     "per side, the sides taking turns (0 with --torch: PyTorch's "
                     "steps after jaxtl's). Rows say how many rounds each side won, "
                     "with p, the chance of that many if both were as fast; "
                     "--steps=1 --rounds=80 tells a 1-2% change from noise.", lower_bound=0)
flags.DEFINE_integer("loss_chunk_len", objectives.LOSS_CHUNK_LEN, "Positions whose "
                     "logits exist at once in the loss (0: all), as "
                     "config.objective.loss_chunk_len.", lower_bound=0)
flags.DEFINE_boolean("memory", False, "Instead of timing: parameter + optimizer "
                     f"bytes per device under the meshes {MEMORY_MESHES} "
                     "(on a CPU, 8 host devices are made for it).")
flags.DEFINE_list("pipeline", [], "Instead of timing steps: the host input pipeline "
                  "of these pretraining recipes (pretrain_mlm, pretrain_span:arg, ...).")
flags.DEFINE_list("pipeline_set", [], "--pipeline: config keys to set, e.g. a "
                  "GPU preset's shape: data.seq_len=512,data.batch_size=128.")
flags.DEFINE_integer("pipeline_docs", 5000, "Documents per split read by --pipeline.",
                     lower_bound=1)
flags.DEFINE_list("workers", ["0", "1", "2"], "--pipeline: Grain worker counts to "
                  "time the objective's batches with.")
flags.DEFINE_list("rss", [], "Instead of timing steps: peak host memory of these "
                  "pretraining recipes' runs (--steps steps) as the corpus grows.")
flags.DEFINE_list("rss_repeats", ["1", "10"], "--rss: how many times the train files "
                  "are listed (the corpus repeated).")
flags.DEFINE_string("workdir", "/tmp/jaxtl_benchmark", "--pipeline keeps its "
                    "trained tokenizers here.")
flags.DEFINE_list("generate", [], "Instead of train steps: greedy generation with a KV "
                  "cache at these batch sizes (decoder presets; --steps timed calls).")
flags.DEFINE_integer("prompt_len", 128, "--generate: prompt tokens per row.", lower_bound=1)
flags.DEFINE_integer("new_tokens", 128, "--generate: tokens generated per row.", lower_bound=1)
flags.DEFINE_string("profile", "", "Also trace --steps more jaxtl steps into "
                    "DIR/PRESET and print where their device time goes.")
flags.DEFINE_string("results", "", "Markdown file to append the table to (empty: none).")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  f = FLAGS
  # Before the backend starts: growing, not preallocating, device memory
  # leaves PyTorch room on the GPU; --profile traces the CPU thunks;
  # --memory shards over 8 host devices.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  extra = ([CPU_TRACE_FLAG] if f.profile else []) + (
      ["--xla_force_host_platform_device_count=8"] if f.memory else [])
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *extra]).strip()
  if f.pipeline:
    rows = [r for recipe in f.pipeline
            for r in footprint.pipeline_rows(recipe, f.workdir, f.pipeline_docs,
                                             workers=tuple(map(int, f.workers)),
                                             overrides=tuple(f.pipeline_set))]
  elif f.rss:
    rows = [r for recipe in f.rss
            for r in footprint.corpus_rss_rows(recipe, f.workdir,
                                               tuple(map(int, f.rss_repeats)),
                                               steps=f.steps)]
  elif f.memory:
    rows = footprint.memory_rows(f.presets)
  elif f.generate:
    rows = benchmark_generate.generation_rows(
        f.presets, [int(b) for b in f.generate], prompt_len=f.prompt_len,
        new_tokens=f.new_tokens, runs=f.steps, dtype=f.dtype, torch_side=f.torch,
        overrides=bench.parse_overrides(f.model))
  elif f.versus:
    if f.torch or f.keras or f.profile:
      raise app.UsageError("--versus times two jaxtl steps against each other: drop "
                           "--torch, --keras and --profile")
    if f.rounds < 1:
      raise app.UsageError("--versus needs --rounds of 1 or more")
    changed = bench.parse_overrides(f.versus, "--versus", versus_items=True)
    rows = bench.versus(f.presets, changed, warmup=f.warmup, steps=f.steps,
                        rounds=f.rounds, dtype=f.dtype, batch_size=f.batch_size,
                        length=f.length, num_devices=f.devices,
                        overrides=bench.parse_overrides(f.model),
                        loss_chunk_len=f.loss_chunk_len)
  else:
    rows = bench.benchmark(f.presets, torch_side=f.torch, keras_side=f.keras,
                     warmup=f.warmup, steps=f.steps,
                     dtype=f.dtype, batch_size=f.batch_size, length=f.length,
                     num_devices=f.devices,
                     overrides=bench.parse_overrides(f.model), loss_chunk_len=f.loss_chunk_len,
                     profile_dir=f.profile, rounds=f.rounds)
  print(bench.markdown(rows))
  if f.results:
    bench.append_results(f.results, rows, shlex.join(["jaxtl", "benchmark", *sys.argv[1:]]))
