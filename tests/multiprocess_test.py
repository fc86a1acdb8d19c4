"""Multi-host training on one machine: 2 processes x 2 CPU devices.

Each process starts ``python -m jaxtl pretrain --multiprocess`` against a
localhost coordinator, feeds its own half of every global batch and talks to
the other over CPU collectives (gloo). With the parameters sharded FSDP-style
over all 4 devices, each process writes its own shards of each checkpoint.
The losses must equal a 1-process run on 4 devices with the same global
batch, and that 1-process run must resume from the 2-process checkpoint.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import checkpoint_test
import runs

pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.multiprocess]

config_file = checkpoint_test.config_file  # the tiny CLM recipe (a fixture)

MESH = "--config.mesh.shape=(1,-1,1)"  # FSDP over every device of every process


def _command(config_file, workdir, steps):
  return [sys.executable, "-m", "jaxtl", "pretrain", f"--config={config_file}",
          f"--workdir={workdir}", MESH, f"--config.train.steps={steps}",
          "--config.train.checkpoint_every=3"]


def _env(devices):
  return {**os.environ, "JAX_PLATFORMS": "cpu",
          "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {runs.XLA_FLAGS}"}


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _check(procs):
  for proc in procs:
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
  return err


def test_two_processes_match_one_and_resume_on_one(config_file, tmp_path):
  ref, multi = str(tmp_path / "ref"), str(tmp_path / "multi")
  start = lambda cmd, devices: subprocess.Popen(
      cmd, cwd=runs.REPO, env=_env(devices), stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)
  coordinator = f"localhost:{_free_port()}"
  procs = [start(_command(config_file, multi, 6)
                 + ["--multiprocess", f"--coordinator_address={coordinator}",
                    "--num_processes=2", f"--process_id={i}"], devices=2)
           for i in range(2)]
  assert "process 1 of 2" in _check(procs)
  err = _check([start(_command(config_file, ref, 8), devices=4)])
  assert "process 0 of 1" in err
  # Each process wrote its own shards of the step-6 checkpoint.
  step = os.path.join(multi, "checkpoints", "6")
  written = {name for _, dirs, _ in os.walk(step) for name in dirs}
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= written, sorted(written)

  two = runs.logged_losses(multi)
  err = _check([start(_command(config_file, multi, 8), devices=4)])
  assert "resumed from checkpoint step 6" in err
  one, resumed = runs.logged_losses(ref), runs.logged_losses(multi)
  steps = [("eval", 0)] + [("train", s) for s in range(1, 7)]
  np.testing.assert_allclose([two[k] for k in steps], [one[k] for k in steps], rtol=1e-5)
  after = [("train", 7), ("train", 8), ("eval", 8)]
  np.testing.assert_allclose([resumed[k] for k in after], [one[k] for k in after],
                             rtol=1e-5)


def test_two_processes_fine_tune_as_one(pretrained, tmp_path):
  """Fine-tuning on 2 processes: each cuts the whole batch's padding and
  keeps its half, and the predictions are gathered (each process sees the
  whole split's): the losses, the test scores and the examples per step
  equal a 1-process run's on the same 4 devices."""
  args = ["finetune", "--config=finetune:task=trec", f"--config.init_from={pretrained}",
          "--config.train.epochs=1", "--config.task.num_train_examples=32",
          "--config.task.max_eval_examples=16", "--config.task.max_len=32",
          "--config.train.length_multiple=16", "--config.train.checkpoint_every=0",
          "--config.train.batch_size=8", "--config.train.log_every=1", MESH]
  start = lambda workdir, devices, *extra: subprocess.Popen(
      [sys.executable, "-m", "jaxtl", *args, f"--workdir={workdir}", *extra], cwd=runs.REPO,
      env=_env(devices), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  coordinator = f"localhost:{_free_port()}"
  multi, one = tmp_path / "multi", tmp_path / "one"
  procs = [start(multi, 2, "--multiprocess", f"--coordinator_address={coordinator}",
                 "--num_processes=2", f"--process_id={i}") for i in range(2)]
  procs.append(start(one, 4))
  _check(procs)
  records = lambda d: [json.loads(l) for l in open(d / "metrics.jsonl")]
  two, single = records(multi), records(one)
  assert [(r["split"], r["step"]) for r in two] == [(r["split"], r["step"]) for r in single]
  assert all(r["examples"] == 8 for r in two if r["split"] == "train")  # per logged step
  for a, b in zip(two, single):
    for name in ("loss", "accuracy", "examples"):
      if name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, err_msg=(a, name))
  assert json.load(open(multi / "results.json"))["test"] == pytest.approx(
      json.load(open(one / "results.json"))["test"])
