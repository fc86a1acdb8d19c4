"""Fine-tuning is as robust as pretraining: kill -9 mid-epoch and SIGTERM
resume exactly, non-finite steps are skipped (and stop the run when they
repeat), and gradient accumulation equals the full batch."""

import json
import re
import signal
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.data import batches
from jaxtl.tasks import finetune
from jaxtl import train
from jaxtl.train import checkpoint

import runs

pytestmark = pytest.mark.slow  # each test fine-tunes (two in subprocesses)

EPOCHS, STEPS_PER_EPOCH = 3, 4  # 64 TREC examples in batches of 16
STEPS = EPOCHS * STEPS_PER_EPOCH


@pytest.fixture(scope="module")
def config_file(pretrained, tmp_path_factory):
  """A small TREC fine-tuning (like ``_config``) as a config file for
  ``jaxtl.programs.train``: checkpoints every 3/4 epoch (steps 3, 6, 9: all but the
  last mid-epoch), a log line every step."""
  path = tmp_path_factory.mktemp("ftcfg") / "tiny_trec.py"
  path.write_text(textwrap.dedent(f"""
      from jaxtl.configs import finetune

      def get_config(arg=None):
        c = finetune.get_config("task=trec,scheme=full")
        c.init_from = "{pretrained}"
        c.task.update(num_train_examples=64, max_eval_examples=32, max_len=24)
        c.optim.warmup_steps = 2
        c.train.update(epochs={EPOCHS}, batch_size=16, log_every=1,
                       checkpoint_every=0.75)
        return c
  """))
  return str(path)


@pytest.fixture(scope="module")
def uninterrupted(config_file, tmp_path_factory):  # pylint: disable=redefined-outer-name
  workdir = str(tmp_path_factory.mktemp("ft_ref"))
  runs.run(config_file, workdir, "--mode=finetune")
  return _results(workdir)


def _results(workdir):
  """results.json less the timings."""
  with open(f"{workdir}/results.json") as f:
    results = json.load(f)
  for h in results["history"]:
    del h["train_seconds"]
  return results


@pytest.mark.subprocess
def test_killed_mid_epoch_and_resumed_fine_tuning_matches_uninterrupted(
    config_file, uninterrupted, tmp_path):  # pylint: disable=redefined-outer-name
  workdir = str(tmp_path)
  code, _ = runs.interrupt(config_file, workdir, signal.SIGKILL, 1, "--mode=finetune")
  assert code == -signal.SIGKILL, "the run finished before it could be killed"
  err = runs.run(config_file, workdir, "--mode=finetune")
  resumed = re.search(r"resumed from checkpoint step (\d+)", err)
  assert resumed, err[-3000:]
  at = int(resumed.group(1))
  assert at < STEPS and at % STEPS_PER_EPOCH, f"resumed from step {at}"
  assert _results(workdir) == uninterrupted


@pytest.mark.subprocess
def test_sigterm_saves_fine_tuning_at_the_stop_step_and_the_rerun_finishes(
    config_file, uninterrupted, tmp_path):  # pylint: disable=redefined-outer-name
  workdir = str(tmp_path)
  code, err = runs.interrupt(config_file, workdir, signal.SIGTERM, 1, "--mode=finetune")
  assert code == train.EXIT_PREEMPTED, err[-3000:]
  assert "rerun the same command to resume" in err
  assert not (tmp_path / "results.json").exists()
  stopped = max(s for (_, s) in runs.logged_losses(workdir, ("train",)))
  assert runs.checkpoint_steps(workdir)[-1] == stopped < STEPS
  err = runs.run(config_file, workdir, "--mode=finetune")
  assert f"resumed from checkpoint step {stopped} " in err
  assert _results(workdir) == uninterrupted


@pytest.fixture
def poisoned_steps(monkeypatch):
  """The (1-based) training steps at which the task loss is NaN: the test
  fills in this set.

  The batches carry a per-row marker (so it shards like them) that the
  wrapped loss turns into a NaN; gradients stay finite, as with a bad batch.
  """
  bad = set()

  class Marked(batches.BatchIterator):

    def __next__(self):
      batch = super().__next__()
      step = self.epoch * self.batches_per_epoch + self.index
      batch["poison"] = np.full(len(batch["labels"]), step in bad, np.float32)
      return batch

  make_loss_fn = finetune.make_task_loss_fn

  def poisoned(model):
    loss_fn = make_loss_fn(model)

    def wrapped(params, batch, rng, normalizer=None):
      loss, sums = loss_fn(params, batch, rng, normalizer)
      return jnp.where(jnp.max(batch["poison"]) > 0, jnp.nan, loss), sums
    return wrapped

  monkeypatch.setattr(batches, "BatchIterator", Marked)
  monkeypatch.setattr(finetune, "make_task_loss_fn", poisoned)
  return bad


def test_one_non_finite_step_is_skipped_and_repeated_ones_stop_fine_tuning(
    pretrained, poisoned_steps, tmp_path, caplog):  # pylint: disable=redefined-outer-name
  config = runs.finetune_config(pretrained, "full", max_eval_examples=16)
  config.train.max_bad_steps = 3
  poisoned_steps.add(3)
  with caplog.at_level("WARNING"):
    results = finetune.finetune_and_evaluate(config, str(tmp_path / "once"))
  assert "step 3: non-finite loss or gradient; update skipped (1 in a row)" in caplog.text
  assert np.isfinite(results["history"][-1]["train_loss"])
  poisoned_steps.update(range(2, 9))  # all but the first of the 8 steps
  with pytest.raises(FloatingPointError, match=r"3 consecutive steps up to step 4 "
                     r".*max_bad_steps=3"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "always"))


def test_gradient_accumulation_in_fine_tuning_equals_the_full_batch(
    pretrained, tmp_path):  # pylint: disable=redefined-outer-name
  params = {}
  for accum in (1, 2, 4):
    config = runs.finetune_config(pretrained, "full", max_eval_examples=16, head_dropout=0.0)
    config.adapt.dropout_rate = 0.0
    config.optim.update(accum_steps=accum, lr=1e-3, warmup_steps=0, schedule="constant")
    config.train.epochs = 1
    finetune.finetune_and_evaluate(config, str(tmp_path / str(accum)))
    params[accum] = checkpoint.load_params(tmp_path / str(accum))  # the last step's
  # The updates are large enough that a wrong gradient would show.
  stack = lambda p: jax.tree.leaves(p["stack"])
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(
      stack(params[1]["backbone"]), stack(checkpoint.load_params(pretrained))))
  assert moved > 1e-3
  for accum in (2, 4):
    for a, b in zip(jax.tree.leaves(params[accum]), jax.tree.leaves(params[1])):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=f"accum_steps={accum}")
