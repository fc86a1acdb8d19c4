"""Pretraining in stages (config.stages): both shapes run under one schedule,
a run stopped inside any stage resumes exactly, a bad stage is named."""

import json
import os
import shutil

import numpy as np
import pytest
from flax import traverse_util

import runs
from jaxtl.pretraining import pretrain
from jaxtl.pretraining import pipeline
from jaxtl.train import checkpoint, optim

STEPS = (2, 2)  # stage 1: length 32, batch 16; stage 2: length 64, batch 8


def _staged_config():
  config = runs.tiny_mlm_config()
  config.data.update(seq_len=64, batch_size=8)  # the last stage's, and eval's
  config.stages = (dict(steps=STEPS[0], data=dict(seq_len=32, batch_size=16)),
                   dict(steps=STEPS[1]))
  config.optim.update(warmup_steps=2)
  config.train.update(steps=sum(STEPS), log_every=1, eval_every=0, eval_batches=1,
                      checkpoint_every=1, keep_checkpoints=sum(STEPS))
  return config


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _flat(params):
  return {k: np.asarray(v) for k, v in
          traverse_util.flatten_dict(params, sep="/").items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted two-stage run: its workdir, losses and final params."""
  workdir = str(tmp_path_factory.mktemp("staged"))
  pretrain.train_and_evaluate(_staged_config(), workdir)
  return workdir, runs.logged_losses(workdir), _flat(checkpoint.load_params(workdir))


@pytest.mark.slow
def test_stages_run_in_order_under_one_schedule(reference):
  workdir, losses, _ = reference
  records = _records(workdir)
  stages = [r for r in records if r["split"] == "stage"]
  assert [(r["step"], r["encoder_length"], r["batch_size"]) for r in stages] == [
      (0, 32, 16), (STEPS[0], 64, 8)]
  train_steps = [r["step"] for r in records if r["split"] == "train"]
  assert train_steps == list(range(1, sum(STEPS) + 1))  # total = sum of stages
  # One schedule over all steps: the boundary does not restart the warmup.
  schedule = optim.make_schedule(_staged_config().optim, sum(STEPS))
  rates = [r["learning_rate"] for r in records if r["split"] == "train"]
  np.testing.assert_allclose(rates, [schedule(s - 1) for s in train_steps], rtol=1e-6)
  assert ("eval", sum(STEPS)) in losses
  # Each stage's tokens per second is counted at its own shape.
  by_step = {r["step"]: r for r in records if r["split"] == "train"}
  for step, tokens in ((1, 32 * 16), (sum(STEPS), 64 * 8)):
    assert by_step[step]["tokens_per_s"] == pytest.approx(
        by_step[step]["steps_per_s"] * tokens, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("stopped_at", [1, STEPS[0], STEPS[0] + 1])
def test_a_run_stopped_inside_a_stage_resumes_exactly(reference, tmp_path, stopped_at):
  """Inside stage 1, at its last step, inside stage 2: as if killed right
  after that checkpoint (the later ones removed), then run again."""
  ref_dir, ref_losses, ref_params = reference
  workdir = str(tmp_path / "resumed")
  shutil.copytree(ref_dir, workdir)
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  for step in runs.checkpoint_steps(workdir):
    if step > stopped_at:
      shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
  pretrain.train_and_evaluate(_staged_config(), workdir)
  resumed = runs.logged_losses(workdir)
  assert sorted(resumed) == sorted(k for k in ref_losses if k[1] > stopped_at)
  assert resumed == {k: ref_losses[k] for k in resumed}
  params = _flat(checkpoint.load_params(workdir))
  for name, value in ref_params.items():
    np.testing.assert_array_equal(params[name], value, err_msg=name)


@pytest.mark.parametrize("stages,error", [
    ((dict(steps=2, data=dict(seq_len=32)), dict(steps=2, dat=dict())),
     r"config.stages\[1\]: unknown key 'dat'"),
    ((dict(steps=2, data=dict(seq_len=32)), dict(steps=2, data=dict(seq_lenn=8))),
     r"config.stages\[1\].data.seq_lenn: config.data has no key"),
    ((dict(steps=2), dict(steps=2, data=dict(source=dict(fild="x")))),
     r"config.stages\[1\].data.source.fild: config.data.source has no key"),
    ((dict(steps=4), dict(steps=0)), r"config.stages\[1\].steps=0"),
    ((dict(steps=4, data=dict(tokenizer=dict(vocab_size=9))),),
     r"config.stages\[0\].data.tokenizer: one for the whole run"),
    ((dict(steps=3), dict(steps=3)), r"3 \+ 3 = 6 steps.*config.train.steps=4"),
])
def test_a_bad_stage_is_named_before_any_work(tmp_path, stages, error):
  config = _staged_config()
  config.stages = stages
  with pytest.raises(ValueError, match=error):
    pretrain.train_and_evaluate(config, str(tmp_path))
  assert not os.listdir(tmp_path)


def test_a_stage_longer_than_the_models_positions_is_named(tmp_path):
  config = _staged_config()
  config.model.max_len = 48
  config.data.seq_len = 32
  config.stages = (dict(steps=2), dict(steps=2, data=dict(seq_len=64)))
  with pytest.raises(ValueError, match=r"config.stages\[1\].data.seq_len: batches "
                                       r"of 64 tokens need 64 positions, but the "
                                       r"model has 48 \(config.model.max_len\)"):
    pretrain.train_and_evaluate(config, str(tmp_path))


def test_a_later_stage_over_the_same_rows_draws_its_own_order_and_masks():
  rows = {"tokens": np.arange(64, dtype=np.int32).reshape(16, 4)}
  noisy = lambda row, rng: {"tokens": row["tokens"], "noise": rng.random(1)}
  first, later = (pipeline.BatchIterator(rows, noisy, batch_size=8, seed=3,
                                         stream=stream) for stream in ((), (1,)))
  a, b = next(first), next(later)
  # The first stage (and a run without stages) draws as the iterator always did.
  order = np.random.default_rng((3, 0)).permutation(16)[:8]
  np.testing.assert_array_equal(a["tokens"], rows["tokens"][order])
  ids = a["tokens"][:, 0] // 4
  np.testing.assert_array_equal(
      a["noise"][:, 0], [np.random.default_rng((3, 0, i)).random() for i in ids])
  assert not np.array_equal(a["tokens"], b["tokens"])
  assert not np.intersect1d(a["noise"], b["noise"]).size
