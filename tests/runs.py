"""``python -m jaxtl pretrain`` (or ``finetune``) in a subprocess: what the kill and SIGTERM tests
of pretraining and fine-tuning share (a real process, real signals)."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np

import datadir

REPO = pathlib.Path(__file__).resolve().parent.parent

# XLA flags of every test process, and all of those of the runs the tests
# start (one CPU device each). Compiling is most of the suite's time, and the
# tests' tiny programs run about as fast either way:
# - XLA:CPU's LLVM backend at -O0 halves a tiny model's train step compile
#   (7 -> 3.5 CPU s);
# - at -O0, XLA:CPU's older loop emitters compile a third faster than its
#   MLIR fusion emitters (a tiny MLM pretraining's compiles: 6.8 -> 4.5 s;
#   models_test + heads_test: 174 -> 114 CPU s). At -O2, what users run,
#   it is the other way round (MiniLM's step: 12 -> 28 s), so only tests
#   turn them off;
# - one LLVM module per program, not split for parallel codegen: the two
#   test workers already fill the 2 cores (models_test + heads_test on them:
#   75 -> 62 s wall).
SPEED_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
               "--xla_cpu_parallel_codegen_split_count=1")
# Lets the benchmark's --profile test see XLA:CPU's ops
# (jaxtl.tools.profiling.CPU_TRACE_FLAG; nothing is recorded while no trace runs).
TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"


def _known_flags(flags: tuple[str, ...]) -> tuple[str, ...]:
  """Those of ``flags`` the installed XLA knows.

  XLA aborts a process whose XLA_FLAGS name a flag it lacks, and releases
  drop flags (jaxlib 0.11 dropped ``--xla_cpu_use_fusion_emitters``: every
  test worker then died at start). One process of the run asks XLA; the
  answer travels in the environment to the workers and subprocesses.
  """
  known = os.environ.get("JAXTL_TEST_XLA_FLAGS")
  if known is None:
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices('cpu')"], check=False,
        capture_output=True, text=True,
        env={**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"})
    # The abort names the unknown flags; any other failure keeps them all.
    known = " ".join(f for f in flags if probe.returncode == 0
                     or f.split("=")[0] not in probe.stderr)
    os.environ["JAXTL_TEST_XLA_FLAGS"] = known
  return tuple(known.split())


_KNOWN = _known_flags((*SPEED_FLAGS, TRACE_FLAG))
XLA_FLAGS = " ".join(f for f in SPEED_FLAGS if f in _KNOWN)
TRACE_FLAGS = " ".join(f for f in (TRACE_FLAG,) if f in _KNOWN)


def start(config_file: str, workdir: str, *flags: str) -> subprocess.Popen:
  """Starts a run on one CPU device; stderr (the log) is piped."""
  env = {**os.environ, "XLA_FLAGS": XLA_FLAGS, "JAX_PLATFORMS": "cpu"}
  command = "finetune" if "--mode=finetune" in flags else "pretrain"
  flags = tuple(f for f in flags if not f.startswith("--mode="))
  return subprocess.Popen(
      [sys.executable, "-m", "jaxtl", command, f"--config={config_file}",
       f"--workdir={workdir}", *flags], cwd=REPO, env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run(config_file: str, workdir: str, *flags: str) -> str:
  """Runs to the end; returns the log (stderr)."""
  proc = start(config_file, workdir, *flags)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  return err


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the complete checkpoints (Orbax renames a step's directory to
  its number only once it is written)."""
  ckpts = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in ckpts.iterdir()
                if p.name.isdigit()) if ckpts.is_dir() else []


def interrupt(config_file: str, workdir: str, sig: int, min_step: int,
              *flags: str) -> tuple[int, str]:
  """Starts a run and sends ``sig`` once a checkpoint at ``min_step`` or
  later exists; returns (exit code, log)."""
  proc = start(config_file, workdir, *flags)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if any(s >= min_step for s in checkpoint_steps(workdir)):
      proc.send_signal(sig)
      break
    time.sleep(0.02)
  _, err = proc.communicate(timeout=240)
  return proc.returncode, err


def logged_losses(workdir: str, splits: tuple[str, ...] = ("train", "eval")
                  ) -> dict[tuple[str, int], float]:
  """Last logged loss per (split, step) (a resumed run re-logs some steps)."""
  losses = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      if record["split"] in splits:
        losses[(record["split"], record["step"])] = record["loss"]
  return losses


def tiny_clm_config(tmp: pathlib.Path, settings: str, lines: int = 3000,
                    recipe: str = "pretrain_clm") -> str:
  """Writes a synthetic corpus (sentences with learnable structure) and a
  config file running ``configs/pretrain_clm.py`` (or ``recipe``) on it with
  a 200-token BPE; ``settings`` are more lines of ``get_config`` (model
  size, steps, ...)."""
  rng = np.random.default_rng(0)
  parts = (["the cat", "a dog", "my friend", "the king", "our teacher"],
           ["sees", "likes", "finds", "calls", "follows"],
           ["the moon", "a river", "the house", "an old song", "the market"])
  text = "\n".join(" ".join(rng.choice(p) for p in parts) + "." for _ in range(lines))
  for name in ("train", "valid"):
    (tmp / f"{name}.txt").write_text(text + "\n")
  cfg = tmp / f"tiny_{recipe}.py"
  cfg.write_text(textwrap.dedent(f"""
      from jaxtl.configs import {recipe}

      def get_config(arg=None):
        c = {recipe}.get_config()
        with c.unlocked():
          c.data.source.kind = "text"
          c.data.source.files = dict(train=["{tmp}/train.txt"],
                                     validation=["{tmp}/valid.txt"])
        c.data.tokenizer.update(vocab_size=200, model_type="bpe")
  """) + textwrap.indent(textwrap.dedent(settings).strip(), "  ") + "\n  return c\n")
  return str(cfg)


def finetune_config(pretrained, scheme, **task):
  """A small TREC fine-tuning of ``pretrained`` with ``scheme``."""
  config = importlib.import_module("jaxtl.configs.finetune").get_config(
      f"task={task.pop('name', 'trec')},scheme={scheme}")
  config.init_from = pretrained
  config.task.update(**{"num_train_examples": 64, "max_len": 24, **task})
  config.train.update(epochs=2, batch_size=16)
  return config


def tiny_mlm_config():
  """A tiny BERT's MLM on tiny Shakespeare (the `pretrained` fixture's run);
  skips without the data."""
  datadir.require_data("tiny_shakespeare", "input.txt")
  config = importlib.import_module("jaxtl.configs.pretrain_mlm").get_config()
  text = str(datadir.data_dir() / "tiny_shakespeare" / "input.txt")
  with config.unlocked():
    config.data.source.kind = "text"
    config.data.source.paragraphs = False
    config.data.source.files = dict(train=[text], validation=[text])
  config.data.tokenizer.update(vocab_size=800)
  config.data.update(seq_len=32, batch_size=8, max_docs=4000)
  config.model.update(num_layers=2, d_model=32, num_heads=2, head_dim=16, mlp_dim=64)
  return config
