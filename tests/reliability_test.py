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

from jaxtl import layout
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


@pytest.mark.subprocess
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
    assert f"pid {os.getpid()} " in (tmp_path / layout.LOCK_FILE).read_text()


def test_a_file_where_the_workdir_should_be_is_a_mistake_named_in_one_line(tmp_path):
  from jaxtl.runtime import console  # pylint: disable=g-import-not-at-top
  (tmp_path / "notes").write_text("")
  for path, says in ((tmp_path / "notes", rf"^--workdir {tmp_path}/notes"),
                     (tmp_path / "notes" / "run", rf"^--workdir {tmp_path}/notes/run "
                                                  rf"cannot be made: {tmp_path}/notes")):
    with pytest.raises(NotADirectoryError, match=says + " is a file, not a folder; pass "
                       "another --workdir$") as raised:
      with workdir.owned(str(path)):
        pass
    assert isinstance(raised.value, console.MISTAKES)  # one line, exit 2


def test_a_workdir_refuses_a_run_of_another_model(tmp_path):
  from jaxtl.models import TransformerConfig  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
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
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
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
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain_clm.get_config()
  section, field = key.split(".")
  config[section][field] = value
  with pytest.raises(train.ConfigError, match=message):
    pretrain.loop_config(config)


def test_a_batch_the_mesh_cannot_split_names_its_key():
  """Each batch is split over the mesh's data and fsdp devices: a batch size
  that is not a multiple of them is one line naming the key (not JAX's
  sharding error at the first step), in a stage and in fine-tuning too."""
  from jaxtl import train  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import pretrain_clm  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import config as pretrain_config  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import config as tasks_config  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  from jaxtl.train import sharding  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh((2, 2, 2), jax.devices()[:8])
  assert sharding.batch_devices(mesh) == 4  # data x fsdp; tensor splits no batch
  config = pretrain_clm.get_config()
  config.data.batch_size = 6
  with pytest.raises(train.ConfigError, match=r"config.data.batch_size=6: must be a "
                     r"multiple of 4: config.mesh.shape splits each batch over 4 devices"):
    pretrain.loop_config(pretrain_config.of(config), batch_devices=4)
  config.data.batch_size = 8
  config.stages = (dict(steps=2, data=dict(batch_size=6)), dict(steps=config.train.steps - 2))
  with pytest.raises(train.ConfigError, match=r"config.stages\[0\].data.batch_size=6"):
    pretrain.loop_config(pretrain_config.of(config), batch_devices=4)
  assert pretrain.loop_config(pretrain_config.of(config), batch_devices=2).batch_size == 8
  fine = finetune_config.get_config()
  fine.train.batch_size = 10
  with pytest.raises(train.ConfigError, match=r"config.train.batch_size=10: must be a multiple of 4"):
    finetune.loop_config(tasks_config.of(fine), steps_per_epoch=10, batch_devices=4)


def test_fine_tuning_for_zero_epochs_names_the_key():
  from jaxtl import train  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import config as tasks_config  # pylint: disable=g-import-not-at-top
  config = finetune_config.get_config()
  config.train.epochs = 0
  with pytest.raises(train.ConfigError, match=r"config.train.epochs=0: must be more than 0"):
    finetune.loop_config(tasks_config.of(config), steps_per_epoch=10)


def test_checkpoint_every_zero_means_no_periodic_saves_in_pretraining_and_fine_tuning():
  """One meaning: 0 saves nothing periodically; the run's last state is
  still saved (a rerun of a finished run only evaluates; fine-tuning's
  result is in best/)."""
  from jaxtl import train  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import pretrain_clm  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import config as tasks_config  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  pre, fine = pretrain_clm.get_config(), finetune_config.get_config()
  pre.train.checkpoint_every = fine.train.checkpoint_every = 0
  pre_loop = pretrain.loop_config(pre)
  fine_loop = finetune.loop_config(tasks_config.of(fine), steps_per_epoch=10)
  assert pre_loop.checkpoint_every == fine_loop.checkpoint_every == 0
  assert pre_loop.save_last and fine_loop.save_last
  fine.train.checkpoint_every = -0.5
  with pytest.raises(train.ConfigError, match=r"config.train.checkpoint_every=-0.5: must be 0"):
    finetune.loop_config(tasks_config.of(fine), steps_per_epoch=10)


def test_two_tokenizers_in_a_workdir_or_one_past_the_embedding_are_refused(tmp_path):
  """A refused run once left a second tokenizer beside the first; the
  loader took sorted()[0], and fine-tuning then read ids past its 2,048-row
  embedding (NaN losses, blamed on the learning rate)."""
  import types  # pylint: disable=g-import-not-at-top
  from jaxtl.data import tokenizer_files  # pylint: disable=g-import-not-at-top
  from jaxtl.models import TransformerConfig  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  folder = tmp_path / layout.TOKENIZER_DIR
  folder.mkdir()
  for name in ("spm_unigram_2000.model", "spm_unigram_10000.model"):
    (folder / name).write_bytes(b"")
  with pytest.raises(ValueError, match=r"holds 2 tokenizers \(spm_unigram_10000.model, "
                     r"spm_unigram_2000.model\): keep the one"):
    tokenizer_files.workdir_tokenizer(str(tmp_path))
  tok = types.SimpleNamespace(vocab_size=10000)
  with pytest.raises(ValueError, match=r"has 10000 ids, but the model in .* embeds 2048 "
                     r"tokens .*not the tokenizer it was trained with"):
    pretrained.check_tokenizer(tok, TransformerConfig(vocab_size=2048), str(tmp_path))


def test_an_identity_is_checked_only_against_a_workdir_with_checkpoints(tmp_path, caplog):
  """Keys of the identity refuse a start (old -> new); any other setting
  changes on a resume, and the log says which."""
  from jaxtl.train import identity  # pylint: disable=g-import-not-at-top
  ident = {"mode": "finetune", "task.pooling": "", "task.labels": []}
  identity.check(str(tmp_path), {**ident, "task.pooling": "mean"})  # empty: any run
  identity.record(str(tmp_path), ident, {"optim.lr": 1e-3, "train.epochs": 3})
  identity.check(str(tmp_path), {**ident, "task.pooling": "mean"})  # no checkpoints yet
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  identity.check(str(tmp_path), ident)
  with pytest.raises(workdir.WorkdirConflict,
                     match=r"holds checkpoints of another run, and nothing in it was "
                     r"changed: config.task.pooling: '' -> 'mean'\. Pass another --workdir"):
    identity.check(str(tmp_path), {**ident, "task.pooling": "mean"})
  with pytest.raises(workdir.WorkdirConflict,
                     match=r"holds a fine-tuning run's checkpoints: pass another --workdir "
                     r"for this pretraining run$"):
    identity.check(str(tmp_path), {**ident, "mode": "pretrain", "task.pooling": "mean"})
  with caplog.at_level("INFO"):
    identity.record(str(tmp_path), ident, {"optim.lr": 5e-4, "train.epochs": 3})
  assert "resuming with changed settings: config.optim.lr: 0.001 -> 0.0005" in caplog.text
  # A workdir from before identities were recorded: its files tell the mode.
  old = tmp_path / "old"
  (old / "checkpoints" / "5").mkdir(parents=True)
  with pytest.raises(workdir.WorkdirConflict,
                     match=rf"{old} holds a pretraining run's checkpoints: pass another "
                     rf"--workdir for this fine-tuning run; to start from its model: "
                     rf"--config.init_from={old}"):
    identity.check(str(old), ident)
