"""Faults done for real to real runs (``python -m jaxtl pretrain`` subprocesses):
kill -9 in the middle of a checkpoint save, damaged checkpoint files, a
disk that fills or turns read-only, two runs on one workdir, bad config
values and bad data files from the command line. Each asserts the outcome:
nothing lost and an exact resume where a resume is possible, otherwise a
message naming the problem (key, file:line, folder and OS error).

One uninterrupted run (the module's ``baseline``) is what every resumed run
must equal, loss for loss, bit for bit.
"""

import contextlib
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import time

import pytest

import runs

# Real runs in subprocesses, and every test waits for one (or a module fixture's).
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

STEPS, EVERY = 40, 5
SAVE_FAILED = 74  # jaxtl.programs.train.EXIT_SAVE_FAILED


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  return runs.tiny_clm_config(tmp_path_factory.mktemp("faults"), f"""
      c.data.update(seq_len=16, batch_size=8)
      c.model.update(num_layers=1, d_model=32, num_heads=2, head_dim=16,
                     mlp_dim=64, dropout_rate=0.1)
      c.optim.warmup_steps = 5
      c.train.update(steps={STEPS}, log_every=1, eval_every=20, eval_batches=2,
                     checkpoint_every={EVERY}, keep_checkpoints=3)
  """, lines=1000)


@pytest.fixture(scope="module")
def baseline(config_file, tmp_path_factory):
  """(workdir, losses) of the run nothing happened to."""
  workdir = str(tmp_path_factory.mktemp("baseline") / "w")
  runs.run(config_file, workdir)
  return workdir, runs.logged_losses(workdir)


def _assert_same_run(workdir, baseline):
  """Bitwise the baseline's losses, one metrics record per step."""
  assert runs.logged_losses(workdir) == baseline[1]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    keys = [(r["split"], r["step"]) for r in map(json.loads, f)]
  assert len(keys) == len(set(keys))


def _wait_for(predicate, proc, what, timeout=240):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert proc.poll() is None, f"the run ended before {what}"
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.002)


def _partial_saves(workdir):
  ckpts = pathlib.Path(workdir, "checkpoints")
  return [p.name for p in ckpts.iterdir() if ".orbax-checkpoint-tmp" in p.name
          ] if ckpts.is_dir() else []


def test_killed_during_a_checkpoint_save_resumes_exactly(config_file, baseline, tmp_path):
  workdir = str(tmp_path / "w")
  proc = runs.start(config_file, workdir)
  # Orbax writes step N into N.orbax-checkpoint-tmp and renames it when done.
  _wait_for(lambda: any(int(n.split(".")[0]) >= 2 * EVERY for n in _partial_saves(workdir)),
            proc, "a checkpoint save under way")
  proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL, err[-2000:]
  partial = _partial_saves(workdir)
  err = runs.run(config_file, workdir)
  assert "resumed from checkpoint step" in err and "unusable" not in err, err[-2000:]
  _assert_same_run(workdir, baseline)
  assert partial, "the kill came after the save finished"


def _damage(path, how):
  data = bytearray(path.read_bytes())
  if how == "truncate":
    data = data[:len(data) // 2]
  else:
    data[len(data) // 2] ^= 0x10  # one bit
  path.write_bytes(bytes(data))


def _largest_file(step_dir):
  return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_truncated_and_bit_flipped_checkpoints_fall_back_to_an_older_step(
    config_file, baseline, tmp_path):
  workdir = tmp_path / "w"
  shutil.copytree(baseline[0], workdir)
  ckpts = workdir / "checkpoints"
  assert runs.checkpoint_steps(workdir) == [STEPS - 2 * EVERY, STEPS - EVERY, STEPS]
  _damage(ckpts / str(STEPS) / "state" / "array_metadatas" / "process_0", "truncate")
  _damage(_largest_file(ckpts / str(STEPS - EVERY)), "flip")  # array data
  err = runs.run(config_file, str(workdir))
  for step in (STEPS, STEPS - EVERY):
    assert f"checkpoint at step {step} in {ckpts} is unusable" in err, err[-3000:]
    assert (ckpts / f"{step}.corrupt").is_dir()  # moved aside, not deleted
  assert "state/array_metadatas/process_0 is damaged (JSONDecodeError" in err
  assert "Event loop is closed" not in err  # once over a hundred tracebacks
  assert f"resumed from checkpoint step {STEPS - 2 * EVERY}" in err
  # The recomputed steps were saved again, and the run is the same run.
  assert runs.checkpoint_steps(workdir) == [STEPS - 2 * EVERY, STEPS - EVERY, STEPS]
  _assert_same_run(str(workdir), baseline)


def test_a_disk_that_fills_during_a_save_stops_at_once_and_resume_is_exact(
    config_file, baseline, tmp_path):
  """The kernel's file size limit (RLIMIT_FSIZE, set on the running process)
  makes the checkpoint's large data file fail to write as a full disk does,
  in Orbax's background writer (EFBIG where a disk says ENOSPC); small files
  (metrics) still grow."""
  workdir = str(tmp_path / "w")
  proc = runs.start(config_file, workdir)
  _wait_for(lambda: 2 * EVERY in runs.checkpoint_steps(workdir), proc, "a checkpoint")
  resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
  start = time.monotonic()
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == SAVE_FAILED, err[-3000:]
  assert time.monotonic() - start < 30  # no wait for Orbax's threads
  assert (f"saving the checkpoint into {workdir}/checkpoints failed" in err
          and "File too large" in err), err[-3000:]
  saved = runs.checkpoint_steps(workdir)
  assert f"the newest complete one is step {saved[-1]}" in err
  last_logged = max(s for (_, s) in runs.logged_losses(workdir))
  assert last_logged <= saved[-1] + 2 * EVERY  # stopped at the next save, at the latest
  err = runs.run(config_file, workdir)
  assert f"resumed from checkpoint step {saved[-1]}" in err
  _assert_same_run(workdir, baseline)


@contextlib.contextmanager
def _tmpfs(path, size):
  """A tiny filesystem of its own at ``path`` (needs root and the right to
  mount; skips otherwise)."""
  path.mkdir(parents=True)
  if os.geteuid() != 0 or subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
      capture_output=True).returncode:
    pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
  def remount(options):
    # A remount to read-only fails ("busy") while a save holds files open
    # for writing there; the run's next moment between saves lets it in.
    deadline = time.monotonic() + 30
    while True:
      done = subprocess.run(["mount", "-o", f"remount,{options}", str(path)],
                            capture_output=True, text=True)
      if not done.returncode:
        return
      assert "busy" in done.stderr and time.monotonic() < deadline, done.stderr
      time.sleep(0.02)

  try:
    yield remount
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory):
  with contextlib.suppress(OSError), open(directory / "filler", "wb") as f:
    while True:
      f.write(b"\0" * 65536)
      f.flush()


def test_a_read_only_or_full_checkpoints_disk_is_named_at_once(config_file, tmp_path):
  """A real filesystem of its own under ``checkpoints/``: made read-only in
  the middle of a run (once a hang of 300 s), then full before a start."""
  workdir = tmp_path / "w"
  ckpts = workdir / "checkpoints"
  with _tmpfs(ckpts, "8m") as remount:
    proc = runs.start(config_file, str(workdir))
    _wait_for(lambda: 2 * EVERY in runs.checkpoint_steps(workdir), proc, "a checkpoint")
    remount("ro")
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == SAVE_FAILED, err[-3000:]
    assert time.monotonic() - start < 30
    assert f"into {ckpts} failed (EROFS: Read-only file system)" in err, err[-3000:]
    # Full when started again: refused before training, nothing written.
    remount("rw")
    _fill(ckpts)
    logged = (workdir / "metrics.jsonl").read_text()
    proc = runs.start(config_file, str(workdir))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == SAVE_FAILED, err[-3000:]
    assert f"{ckpts} is not writable (ENOSPC: No space left on device)" in err, err[-3000:]
    assert (workdir / "metrics.jsonl").read_text() == logged


def test_two_real_runs_on_one_workdir_the_second_fails_at_once(config_file, tmp_path):
  workdir = tmp_path / "w"
  first = runs.start(config_file, str(workdir), f"--config.train.steps={100 * STEPS}")
  try:
    _wait_for((workdir / "config.txt").exists, first, "the first run to hold the workdir")
    second = runs.start(config_file, str(workdir))
    _, err = second.communicate(timeout=120)
    assert second.returncode == 1, err[-3000:]
    assert f"is in use by another run (pid {first.pid} on " in err
    assert "Traceback" not in err
    assert first.poll() is None  # undisturbed
    assert (workdir / "config.txt").read_text().count("# ") == 1  # no trace of the second
  finally:
    first.kill()
    first.communicate()


def _fails(proc):
  _, err = proc.communicate(timeout=120)
  assert proc.returncode != 0, err[-3000:]
  return err


def test_bad_config_values_from_the_command_line_name_their_key(config_file, tmp_path):
  cases = {  # flag: what the one-paragraph message says
      "--config.train.steps=-5": ["config.train.steps=-5: must be at least 1"],
      "--config.optim.accum_steps=3": ["config.optim.accum_steps=3: must be at least 1 "
                                       "and a divisor of the batch size 8"],
      "--config.train.stepz=5": ["config.train has no key 'stepz'; it has"],
      "--config.data.seq_len=2048": ["config.data.seq_len: batches of 2048 tokens need "
                                     "2048 positions, but the model has 512 "
                                     "(config.model.max_len)"],
  }
  procs = [runs.start(config_file, str(tmp_path / str(i)), flag)
           for i, flag in enumerate(cases)]  # together: each is mostly start-up
  for i, (flag, messages) in enumerate(cases.items()):
    err = _fails(procs[i])
    assert all(m in err for m in messages), (flag, err[-3000:])
    assert "Traceback" not in err, (flag, err[-3000:])
    assert not (tmp_path / str(i) / "metrics.jsonl").exists()


def test_bad_data_files_and_a_task_longer_than_the_positions_are_named(tmp_path):
  """From the command line, fine-tuning: file:line for a broken row, the file
  for a split with no rows; both keys for inputs longer than the model's
  position table."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"]))
  broken = tmp_path / "broken.jsonl"
  broken.write_text('{"text": "good", "label": "pos"}\n{"text": "bad"\n')
  header_only = tmp_path / "dev.csv"
  header_only.write_text("text,label\n")
  train = tmp_path / "train.csv"
  train.write_text("text,label\n" + "good,pos\nbad,neg\n" * 20)
  common = ("--mode=finetune", f"--config.tokenizer_path={vocab}",
            "--config.model.num_layers=1", "--config.model.d_model=16",
            "--config.model.num_heads=2", "--config.model.head_dim=8",
            "--config.model.mlp_dim=32", "--config.train.batch_size=8")
  procs = [
      (runs.start("configs/finetune.py:task=files", str(tmp_path / "a"), *common,
                  f"--config.task.train={broken}"), f"{broken}:2: malformed JSON"),
      (runs.start("configs/finetune.py:task=files", str(tmp_path / "b"), *common,
                  f"--config.task.train={train}", f"--config.task.dev={header_only}"),
       f"{header_only}: no usable rows"),
      (runs.start("configs/finetune.py:task=files", str(tmp_path / "c"), *common,
                  f"--config.task.train={train}", "--config.task.max_len=1024"),
       "config.task.max_len=1024: batches of 1024 tokens need 1024 positions, but "
       "the model has 512 (config.model.max_len)"),
  ]
  for proc, message in procs:
    assert message in _fails(proc)


# ----------------------------------------------------------------------------
# Runs that must not damage a good workdir (issue 28): refused before a byte
# is written, hashed before and after.


def _tree_hash(root):
  """Every file under ``root`` (path and bytes), so that a refused run can be
  shown to have changed nothing; but the lock, which names its last holder
  (a run refused once its data was read held it)."""
  root = pathlib.Path(root)
  return {str(p.relative_to(root)): p.read_bytes()
          for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_a_changed_setting_or_a_swapped_workdir_is_refused_before_writing(
    config_file, baseline, tmp_path):
  """A fine-tune given the pretraining workdir as its --workdir once moved
  every checkpoint aside as corrupt; a new tokenizer size once wrote its
  tokenizer before the refusal (and fine-tuning then read the wrong one)."""
  workdir = tmp_path / "w"
  shutil.copytree(baseline[0], workdir)
  before = _tree_hash(workdir)
  procs = {
      f"{workdir} holds a pretraining run's checkpoints: pass another --workdir for "
      "this fine-tuning run": runs.start(
          "configs/finetune.py:task=trec", str(workdir), "--mode=finetune",
          f"--config.init_from={workdir}"),
      f"{workdir} holds checkpoints of another run, and nothing in it was changed: "
      "config.data.tokenizer.vocab_size: 200 -> 300. Pass another --workdir": runs.start(
          config_file, str(workdir), "--config.data.tokenizer.vocab_size=300"),
  }
  for message, proc in procs.items():
    err = _fails(proc)
    assert message in err and "Traceback" not in err, err[-3000:]
  assert _tree_hash(workdir) == before


def _classification_files(tmp_path):
  """A vocabulary, a learnable two-label train file and a test file large
  enough that its evaluation takes a moment."""
  vocab = tmp_path / "vocab.txt"
  words = ["good", "fine", "bad", "awful"]
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",
                              "film", *words]))
  rows = [f"the film {w},{'pos' if i < 2 else 'neg'}" for i, w in enumerate(words)]
  (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(rows * 40) + "\n")
  (tmp_path / "test.csv").write_text("text,label\n" + "\n".join(rows * 1500) + "\n")
  return vocab


def _finetune(tmp_path, workdir, *flags):
  vocab = _classification_files(tmp_path)
  return runs.start(
      "configs/finetune.py:task=files", str(workdir), "--mode=finetune",
      f"--config.tokenizer_path={vocab}", "--config.model.num_layers=1",
      "--config.model.d_model=16", "--config.model.num_heads=2",
      "--config.model.head_dim=8", "--config.model.mlp_dim=32",
      "--config.train.batch_size=8", "--config.train.epochs=2",
      "--config.train.checkpoint_every=0", f"--config.task.train={tmp_path}/train.csv",
      f"--config.task.test={tmp_path}/test.csv", *flags)


def _signal_on(proc, line_part, sig):
  """Sends ``sig`` once the run logs a line holding ``line_part``; returns
  (exit code, log)."""
  seen = []
  for line in proc.stderr:
    seen.append(line)
    if line_part in line:
      proc.send_signal(sig)
      break
  _, rest = proc.communicate(timeout=120)
  return proc.returncode, "".join(seen) + rest


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
  """A fine-tuning run stopped by SIGTERM in its final test evaluation
  (checkpoint_every=0: once nothing was saved, and the rerun trained all
  over again), then rerun: (tmp dir, workdir, first log, second log)."""
  tmp = tmp_path_factory.mktemp("tuned")
  workdir = tmp / "w"
  first = _signal_on(_finetune(tmp, workdir), "the final test evaluation", signal.SIGTERM)
  proc = _finetune(tmp, workdir)
  _, second = proc.communicate(timeout=300)
  assert proc.returncode == 0, second[-3000:]
  return tmp, workdir, first, second


def test_sigterm_in_the_final_test_evaluation_saves_and_the_rerun_only_evaluates(tuned):
  _, workdir, (code, first), second = tuned
  assert code == 75, first[-3000:]  # EXIT_PREEMPTED
  assert "stopped by SIGTERM during the final test evaluation; the trained state" in first
  steps = runs.checkpoint_steps(workdir)
  assert f"resumed from checkpoint step {steps[-1]}" in second, second[-3000:]
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
  # One fine-tune's whole record (a finished run once kept only its test line).
  assert [r["step"] for r in records if r["split"] == "train"] == [steps[-1]]
  assert sum(r["split"] == "test" for r in records) == 1
  keys = [(r["split"], r["step"]) for r in records]
  assert len(keys) == len(set(keys)), keys  # the rerun's evaluation is not logged twice
  assert {r["split"] for r in records} == {"train", "dev", "test"}
  assert json.loads((workdir / "results.json").read_text())["test"]["accuracy"] >= 0


def test_a_fine_tune_with_another_pooling_or_other_labels_is_refused(tuned, tmp_path):
  """A changed pooling once had the intact checkpoint renamed corrupt and
  task.json rewritten, so predict ran the old weights with the new pooling."""
  tmp, tuned_dir, _, _ = tuned
  workdir = tmp_path / "w"
  shutil.copytree(tuned_dir, workdir)
  before = _tree_hash(workdir)
  for split in ("train", "test"):
    (tmp_path / f"{split}.csv").write_text(
        (tmp / f"{split}.csv").read_text().replace(",neg", ",negative"))
  procs = {
      "config.task.pooling: '' -> 'mean'": _finetune(tmp, workdir, "--config.task.pooling=mean"),
      "label_names: ('neg', 'pos') -> ('negative', 'pos')": _finetune(
          tmp, workdir, f"--config.task.train={tmp_path}/train.csv",
          f"--config.task.test={tmp_path}/test.csv"),
  }
  for message, proc in procs.items():
    err = _fails(proc)
    assert f"{workdir} holds checkpoints of another" in err and message in err, err[-3000:]
    assert "Traceback" not in err and "unusable" not in err
  assert _tree_hash(workdir) == before


def test_predict_refuses_a_run_stopped_before_it_chose_a_model(tuned, tmp_path):
  from jaxtl.tasks import predictor  # pylint: disable=g-import-not-at-top
  _, tuned_dir, _, _ = tuned
  workdir = tmp_path / "w"
  shutil.copytree(tuned_dir, workdir)
  shutil.rmtree(workdir / "best")
  (workdir / "best").mkdir()
  with pytest.raises(FileNotFoundError, match="no finished model yet"):
    predictor.load(str(workdir))


def test_ctrl_c_in_the_first_compile_or_in_training_saves_and_resumes_exactly(
    config_file, baseline, tmp_path):
  """Ctrl-C once segfaulted in the first compile (rc 139) and saved nothing
  in training; it now acts as SIGTERM does, with the shell's exit code 130."""
  workdir = str(tmp_path / "w")
  code, err = _signal_on(runs.start(config_file, workdir), "model: ", signal.SIGINT)
  assert code == 130, err[-3000:]
  assert "stopped by Ctrl-C at step 1 of" in err and runs.checkpoint_steps(workdir) == [1]
  code, err = runs.interrupt(config_file, workdir, signal.SIGINT, 2 * EVERY)
  assert code == 130 and "checkpoint saved" in err, err[-3000:]
  err = runs.run(config_file, workdir)
  assert "resumed from checkpoint step" in err
  _assert_same_run(workdir, baseline)
