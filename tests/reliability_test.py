"""Faults a run must survive or report clearly (issue "never lose a run"):
a second process on a workdir, a holder killed with -9."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jaxtl.train import workdir

_HOLD = textwrap.dedent("""
    import sys, time
    from jaxtl.train import workdir
    with workdir.owned(sys.argv[1]):
      print("held", flush=True)
      time.sleep(120)
""")


def _holder(path):
  proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)],
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_second_run_on_a_workdir_fails_at_once_naming_the_holder(tmp_path):
  proc = _holder(tmp_path)
  try:
    start = time.monotonic()
    with pytest.raises(workdir.WorkdirBusy, match=rf"in use by another run \(pid {proc.pid} on "):
      with workdir.owned(str(tmp_path)):
        pass
    assert time.monotonic() - start < 1
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  # The lock went with the killed process: nothing stale to clean up.
  with workdir.owned(str(tmp_path)):
    with workdir.owned(str(tmp_path)):  # re-entrant within a process
      pass
    assert f"pid {os.getpid()} " in (tmp_path / workdir.LOCK_FILE).read_text()


def test_a_workdir_refuses_a_run_of_another_model(tmp_path):
  from jaxtl.models import TransformerConfig  # pylint: disable=g-import-not-at-top
  from jaxtl.train import pretrained  # pylint: disable=g-import-not-at-top
  cfg = TransformerConfig(num_layers=2, d_model=32, num_heads=2, head_dim=16, mlp_dim=64)
  pretrained.save_model_config(cfg, str(tmp_path))
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  # Dropout, dtype, remat may change on resume; the architecture may not.
  pretrained.save_model_config(cfg.replace(dropout_rate=0.0, remat="full"), str(tmp_path))
  # A workdir written before a field existed (embed_dim) had its default.
  recorded = json.loads((tmp_path / "model_config.json").read_text())
  del recorded["embed_dim"]
  (tmp_path / "model_config.json").write_text(json.dumps(recorded))
  pretrained.save_model_config(cfg, str(tmp_path))
  with pytest.raises(workdir.WorkdirConflict,
                     match=r"another model \(d_model: 32 there, 64 here; head_dim"):
    pretrained.save_model_config(cfg.replace(d_model=64, head_dim=32), str(tmp_path))
  assert pretrained.load_model_config(str(tmp_path)).d_model == 32


def test_an_electra_workdir_records_its_generator_and_refuses_another(tmp_path):
  from jaxtl.models import TransformerConfig, electra  # pylint: disable=g-import-not-at-top
  from jaxtl.train import pretrained  # pylint: disable=g-import-not-at-top
  cfg = TransformerConfig(num_layers=2, d_model=32, num_heads=2, head_dim=16, mlp_dim=64)
  pretrained.save_model_config(cfg, str(tmp_path))  # as before generators were recorded
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  with pytest.raises(ValueError, match="records no ELECTRA generator"):
    pretrained.load_generator_config(str(tmp_path))
  half = electra.generator_config(cfg, 0.5)
  pretrained.save_model_config(cfg, str(tmp_path), generator=half)  # no conflict
  assert pretrained.load_generator_config(str(tmp_path)) == half
  assert pretrained.load_model_config(str(tmp_path)) == cfg
  with pytest.raises(workdir.WorkdirConflict, match=r"generator.d_model: 16 there, 8 here"):
    pretrained.save_model_config(cfg, str(tmp_path),
                                 generator=electra.generator_config(cfg, 0.25))


@pytest.mark.parametrize("key,value,message", [
    ("train.steps", -5, r"config.train.steps=-5: must be at least 1"),
    ("train.log_every", 0, r"config.train.log_every=0: must be at least 1"),
    ("train.eval_every", -1, r"config.train.eval_every=-1: must be 0"),
    ("data.batch_size", 0, r"config.data.batch_size=0: must be at least 1"),
    ("train.keep_checkpoints", 0, r"config.train.keep_checkpoints=0: must be at least 1"),
    ("train.checkpoint_every", -1, r"config.train.checkpoint_every=-1: must be 0 \(save"),
    ("optim.accum_steps", 5, r"config.optim.accum_steps=5: .* divisor of the batch size"),
])
def test_bad_loop_values_name_their_key(key, value, message):
  from jaxtl import train  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import pretrain_clm  # pylint: disable=g-import-not-at-top
  from jaxtl.train import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain_clm.get_config()
  section, field = key.split(".")
  config[section][field] = value
  with pytest.raises(train.ConfigError, match=message):
    pretrain.loop_config(config)


def test_fine_tuning_for_zero_epochs_names_the_key():
  from jaxtl import train  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  config = finetune_config.get_config()
  config.train.epochs = 0
  with pytest.raises(train.ConfigError, match=r"config.train.epochs=0: must be more than 0"):
    finetune.loop_config(config, steps_per_epoch=10)


def test_checkpoint_every_zero_means_no_periodic_saves_in_pretraining_and_fine_tuning():
  """One meaning: 0 saves nothing periodically; the run's last state is
  still saved (a rerun of a finished run only evaluates; fine-tuning's
  result is in best/)."""
  from jaxtl import train  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import pretrain_clm  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  from jaxtl.train import pretrain  # pylint: disable=g-import-not-at-top
  pre, fine = pretrain_clm.get_config(), finetune_config.get_config()
  pre.train.checkpoint_every = fine.train.checkpoint_every = 0
  pre_loop, fine_loop = pretrain.loop_config(pre), finetune.loop_config(fine, steps_per_epoch=10)
  assert pre_loop.checkpoint_every == fine_loop.checkpoint_every == 0
  assert pre_loop.save_last and fine_loop.save_last
  fine.train.checkpoint_every = -0.5
  with pytest.raises(train.ConfigError, match=r"config.train.checkpoint_every=-0.5: must be 0"):
    finetune.loop_config(fine, steps_per_epoch=10)
