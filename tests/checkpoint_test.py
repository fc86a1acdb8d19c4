"""Checkpoints: exact resume after a kill, SIGTERM saves, corrupted-latest fallback."""

import errno
import json
import os
import shutil
import signal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl import convert, layout
from jaxtl.models import electra, heads, paths
from jaxtl.train import checkpoint, fingerprints, storage
from jaxtl.pretraining import pretrained
from jaxtl import train

import runs

# Enough steps after the kill's checkpoint that the run is still going when
# the signal comes; a save every 10 (each costs about 0.3 s of waiting for
# Orbax's previous one: 150 steps saving every 5 ran 23 s against 12).
STEPS = 60


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  return runs.tiny_clm_config(tmp_path_factory.mktemp("ckpt"), f"""
      c.data.update(seq_len=16, batch_size=8)
      c.model.update(num_layers=1, d_model=32, num_heads=2, head_dim=16,
                     mlp_dim=64, dropout_rate=0.1)
      c.optim.warmup_steps = 5
      c.train.update(steps={STEPS}, log_every=1, eval_every=20, eval_batches=2,
                     checkpoint_every=10, keep_checkpoints=2)
  """)


@pytest.mark.slow
@pytest.mark.subprocess
def test_killed_and_resumed_run_matches_uninterrupted(config_file, tmp_path):
  ref_dir, dir_ = str(tmp_path / "ref"), str(tmp_path / "killed")
  runs.run(config_file, ref_dir)
  code, _ = runs.interrupt(config_file, dir_, signal.SIGKILL, min_step=10)
  assert code == -signal.SIGKILL, "the run finished before it could be killed"
  killed_at = max(s for (split, s) in runs.logged_losses(dir_) if split == "train")
  assert killed_at < STEPS
  err = runs.run(config_file, dir_)
  assert "resumed from checkpoint step" in err
  ref, resumed = runs.logged_losses(ref_dir), runs.logged_losses(dir_)
  assert ref.keys() == resumed.keys()
  np.testing.assert_allclose([resumed[k] for k in sorted(ref)],
                             [ref[k] for k in sorted(ref)], rtol=1e-6)
  # The killed run's records past its checkpoint were dropped on resume.
  with open(f"{dir_}/metrics.jsonl") as f:
    keys = [(r["split"], r["step"]) for r in map(json.loads, f)]
  assert len(keys) == len(set(keys))


@pytest.mark.subprocess
def test_sigterm_saves_a_checkpoint_at_the_stop_step(config_file, tmp_path):
  workdir = str(tmp_path / "term")
  code, err = runs.interrupt(config_file, workdir, signal.SIGTERM, min_step=10)
  assert code == train.EXIT_PREEMPTED, err[-3000:]
  assert "SIGTERM" in err
  last_logged = max(s for (split, s) in runs.logged_losses(workdir) if split == "train")
  assert runs.checkpoint_steps(workdir)[-1] == last_logged < STEPS


def _tiny_state(value):
  return train.TrainState(step=jnp.array(value, jnp.int32),
                          params={"w": jnp.full((4, 3), float(value))},
                          opt_state=(), bad_steps=jnp.array(0, jnp.int32),
                          skipped_steps=jnp.array(0, jnp.int32))


def _save_steps(directory, steps, keep=3):
  ckpt = checkpoint.Checkpointer(directory, save_every=1, keep=keep, async_save=False)
  for step in steps:
    ckpt.save(step, _tiny_state(step), {"data": {"epoch": 0, "index": step}})
  ckpt.close()


def _abstract():
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _tiny_state(0))


def _data_files(step_dir):
  return [f for f in (step_dir / "state").rglob("*")
          if f.is_file() and f.parent.name == "d"]


def test_unreadable_latest_is_moved_aside_and_the_previous_restored(tmp_path, caplog):
  _save_steps(tmp_path, (1, 2))
  # Corrupt step 2's array data; leave a half-written step 3 lying around.
  for f in (tmp_path / "2" / "state").rglob("*"):
    if f.is_file() and "metadata" not in f.name:
      f.write_bytes(b"garbage")
  (tmp_path / "3.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
  ckpt = checkpoint.Checkpointer(tmp_path, save_every=1, keep=3, async_save=False)
  assert ckpt.all_steps() == [1, 2]
  with caplog.at_level("WARNING"):
    state, extra, step = ckpt.restore_latest(_abstract())
  assert step == 1 and extra["data"]["index"] == 1
  assert checkpoint.FINGERPRINTS not in extra
  np.testing.assert_array_equal(state.params["w"], np.ones((4, 3)))
  assert "step 2" in caplog.text and "previous one" in caplog.text
  # Moved aside, not deleted, so the recomputed step 2 can be written.
  assert (tmp_path / "2.corrupt").is_dir() and not (tmp_path / "2").exists()
  ckpt._manager.reload()  # pylint: disable=protected-access
  assert ckpt.save(2, _tiny_state(2), {"data": {}}, force=True)
  assert ckpt.all_steps() == [1, 2]


def test_changed_array_data_is_caught_by_the_fingerprints(tmp_path, caplog):
  """Array data that still decodes but holds other values (flipped bytes in
  an uncompressed chunk; here another save's arrays under step 2) restores
  without an error; the fingerprints saved with the step catch it."""
  _save_steps(tmp_path / "run", (1, 2))
  _save_steps(tmp_path / "other", (5,))
  shutil.rmtree(tmp_path / "run" / "2" / "state")
  shutil.copytree(tmp_path / "other" / "5" / "state", tmp_path / "run" / "2" / "state")
  run = tmp_path / "run"
  ckpt = checkpoint.Checkpointer(run, save_every=1, keep=3, async_save=False)
  with caplog.at_level("WARNING"):
    _, _, step = ckpt.restore_latest(_abstract())
  assert step == 1, caplog.text
  assert "step 2" in caplog.text and "fingerprint mismatch: params/w" in caplog.text
  # load_params falls back the same way from a workdir's checkpoints.
  (run / "2.corrupt").rename(run / "2")
  with caplog.at_level("WARNING"):
    np.testing.assert_array_equal(checkpoint.load_params(run)["w"], np.ones((4, 3)))
  assert "previous one" in caplog.text


def test_no_intact_checkpoint_stops_instead_of_starting_over(tmp_path):
  _save_steps(tmp_path, (1, 2))
  for step in (1, 2):
    for f in _data_files(tmp_path / str(step)):
      f.write_bytes(b"garbage")
  ckpt = checkpoint.Checkpointer(tmp_path, save_every=1, keep=3, async_save=False)
  with pytest.raises(checkpoint.UnreadableCheckpoints,
                     match=r"(?s)step 2: .*step 1: .*new workdir"):
    ckpt.restore_latest(_abstract())
  assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
      "1.corrupt", "2.corrupt"]
  with pytest.raises(checkpoint.UnreadableCheckpoints, match="no intact checkpoint"):
    checkpoint.load_params(tmp_path / "2.corrupt")
  # The refusal holds at the next start too: it once began again from step 0.
  ckpt = checkpoint.Checkpointer(tmp_path, save_every=1, keep=3, async_save=False)
  with pytest.raises(checkpoint.UnreadableCheckpoints,
                     match=r"holds only checkpoints an earlier start found damaged "
                     r"and moved aside \(1.corrupt, 2.corrupt\)"):
    ckpt.restore_latest(_abstract())


def test_a_checkpoint_of_another_model_is_a_mismatch_and_is_left_alone(tmp_path):
  """A restore into another tree (a changed setting) is not damage: no step
  is moved aside, none is tried in its place."""
  _save_steps(tmp_path, (1, 2))
  before = sorted(p.name for p in tmp_path.iterdir())
  ckpt = checkpoint.Checkpointer(tmp_path, save_every=1, keep=3, async_save=False)
  wider = _abstract().replace(params={"w": jax.ShapeDtypeStruct((4, 5), jnp.float32)})
  with pytest.raises(checkpoint.CheckpointMismatch,
                     match=r"step 2 .* \(1 parameter\(s\) differ: w: \(4, 3\) there, "
                     r"\(4, 5\) here\); it was left as it is"):
    ckpt.restore_latest(wider)
  other = _abstract().replace(opt_state=(jax.ShapeDtypeStruct((4, 3), jnp.float32),))
  with pytest.raises(checkpoint.CheckpointMismatch, match="the optimizer state differs"):
    ckpt.restore_latest(other)
  assert sorted(p.name for p in tmp_path.iterdir()) == before
  assert ckpt.restore_latest(_abstract())[2] == 2


def test_a_run_that_keeps_a_selected_state_but_chose_none_has_no_model(tmp_path):
  """A fine-tuning run stopped mid-epoch has checkpoints/ but an empty
  best/: its newest checkpoint is no one's model, so loading refuses."""
  _save_steps(tmp_path / "checkpoints", (3,))
  (tmp_path / layout.BEST_DIR).mkdir()
  with pytest.raises(checkpoint.NoSelectedModel, match=r"no finished model yet: .*best is "
                     r"empty.*checkpoints/3, is from the middle of an epoch"):
    checkpoint.load_selected(tmp_path)
  shutil.rmtree(tmp_path / layout.BEST_DIR)  # pretraining keeps no best/
  assert checkpoint.selected_checkpoint(tmp_path) == str(tmp_path / "checkpoints" / "3")


def test_a_step_rotated_away_while_it_is_read_is_chosen_again(tmp_path, monkeypatch):
  """A predict beside a run saving into best/ once called the healthy model
  corrupt: its chosen step was deleted under it by the run's rotation."""
  _save_steps(tmp_path / layout.BEST_DIR, (1,), keep=1)
  read = checkpoint.load_params
  def rotated_once(step_dir):
    if step_dir.endswith(os.sep + "1"):  # the run saves step 2, then drops step 1
      _save_steps(tmp_path / layout.BEST_DIR, (2,), keep=1)
      assert not os.path.exists(step_dir)
      raise checkpoint.UnreadableCheckpoints("no intact checkpoint to load")
    return read(step_dir)
  monkeypatch.setattr(checkpoint, "load_params", rotated_once)
  assert float(checkpoint.load_selected(tmp_path)["w"][0, 0]) == 2.0


def test_fingerprints_are_exact_and_the_same_on_device_and_host(monkeypatch):
  tree = {"w": np.random.RandomState(0).normal(size=(5, 7)).astype(np.float32),
          "b": np.arange(6, dtype=np.int32), "h": jnp.ones((3, 2), jnp.bfloat16)}
  host = fingerprints.fingerprints(jax.tree.map(np.asarray, tree))
  assert fingerprints.fingerprints(jax.tree.map(jnp.asarray, tree)) == host
  monkeypatch.setattr(fingerprints, "HOST_BELOW", 0)  # every device array on the device
  assert fingerprints.fingerprints(jax.tree.map(jnp.asarray, tree)) == host
  flipped = np.array(tree["w"])
  flipped.view(np.uint32)[2, 3] ^= 1 << 30
  assert fingerprints.fingerprints({**tree, "w": flipped})["w"] != host["w"]
  swapped = np.array(tree["w"])
  swapped[[0, 1]] = swapped[[1, 0]]
  assert fingerprints.fingerprints({**tree, "w": swapped})["w"] != host["w"]


@pytest.mark.parametrize("host_below", [0, fingerprints.HOST_BELOW])  # device, host
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_one_inf_or_nan_anywhere_makes_a_tree_non_finite_and_huge_values_do_not(
    dtype, host_below, monkeypatch):
  monkeypatch.setattr(fingerprints, "HOST_BELOW", host_below)
  big = jnp.full((64, 3), jnp.finfo(dtype).max, dtype)  # their sum would overflow
  assert fingerprints.is_finite_tree({"w": big, "step": jnp.arange(3), "none": None})
  for bad in (jnp.inf, -jnp.inf, jnp.nan):
    assert not fingerprints.is_finite_tree({"w": big, "v": big.at[40, 1].set(bad)})


def test_refuses_to_save_non_finite_params(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, save_every=1, keep=3, async_save=False)
  bad = _tiny_state(1).replace(params={"w": jnp.full((2,), jnp.nan)})
  with pytest.raises(FloatingPointError, match="NaN"):
    ckpt.save(1, bad, {})
  assert ckpt.all_steps() == []
  shutil.rmtree(tmp_path)


def test_transfer_loads_matching_params_and_reports_the_rest(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", save_every=1, keep=2,
                                 async_save=False)
  pre = {"stack": {"w": jnp.full((2, 3), 7.0)}, "lm_head": {"bias": jnp.ones(5)}}
  ckpt.save(4, _tiny_state(1).replace(params=pre), {})
  ckpt.close()
  params = checkpoint.load_params(tmp_path)  # a workdir resolves to step 4
  target = {"backbone": {"stack": {"w": jnp.zeros((2, 3))}},
            "head": {"out": {"kernel": jnp.zeros((3, 2))}}}
  loaded, report = checkpoint.select_pretrained(target, params, prefix=("backbone",))
  assert list(loaded) == ["backbone/stack/w"]
  np.testing.assert_array_equal(loaded["backbone/stack/w"], 7.0)
  assert report == {"loaded": ["backbone/stack/w"],
                    "discarded": ["backbone/lm_head/bias"],
                    "new": ["head/out/kernel"]}
  _, report = checkpoint.select_pretrained(target, params, prefix=("backbone",),
                                           skip=[r"stack/w"])
  assert report["loaded"] == [] and "backbone/stack/w" in report["new"]
  bad = {"backbone": {"stack": {"w": jnp.zeros((4, 3))}}}
  with pytest.raises(ValueError, match=r"backbone/stack/w: model expects \(4, 3\), "
                     r"checkpoint has \(2, 3\)"):
    checkpoint.select_pretrained(bad, params, prefix=("backbone",))
  with pytest.raises(FileNotFoundError, match="no jaxtl checkpoint"):
    checkpoint.find_checkpoint(tmp_path / "nothing")


def test_a_folder_that_cannot_be_written_fails_the_save_naming_it(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "c", save_every=1, keep=3, async_save=False)
  ckpt.save(1, _tiny_state(1), {})
  # Where the folder was, a file: every write under it fails (ENOTDIR), for
  # root too (which a read-only mode would not stop).
  shutil.rmtree(tmp_path / "c")
  (tmp_path / "c").write_text("")
  with pytest.raises(storage.SaveFailed,
                     match=rf"saving the checkpoint of step 2 into {tmp_path}/c failed "
                           r"\((ENOTDIR|EEXIST): .*newest complete one is none"):
    ckpt.save(2, _tiny_state(2), {})
  ckpt.close()  # after a failure already raised: returns at once
  # A file where a folder is wanted is named as that, not as a disk problem.
  for folder in (tmp_path / "c", tmp_path / "c" / "sub"):
    with pytest.raises(storage.SaveFailed, match=rf"^{tmp_path}/c is a file, not a "
                       r"folder: .*; pass another --workdir$"):
      storage.probe_writable(str(folder))


def test_too_little_free_space_for_one_checkpoint_fails_before_training(tmp_path, monkeypatch):
  state = _tiny_state(1)
  assert storage.state_bytes(state) == 4 * 3 * 4 + 3 * 4  # params, step, counters
  storage.check_space(str(tmp_path), storage.state_bytes(state))
  full = os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255))
  monkeypatch.setattr(os, "statvfs", lambda _: full)
  with pytest.raises(storage.SaveFailed, match=rf"{tmp_path} has 0.0 MiB free, but a "
                     r"checkpoint of this run takes about 1.0 MiB"):
    storage.check_space(str(tmp_path), 2**20)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_killed_electra_run_resumes_exactly_and_transfers_its_discriminator(tmp_path):
  """ELECTRA's generator samples on the device from the step's RNG: a
  resumed run must draw the same replacements, so its losses match. The
  token table is narrower than the model (ELECTRA-small's embed_dim)."""
  steps = 24
  config_file = runs.tiny_clm_config(tmp_path, f"""
      c.data.update(seq_len=16, batch_size=8)
      c.model.update(num_layers=1, d_model=32, num_heads=2, head_dim=16,
                     mlp_dim=64, dropout_rate=0.1, embed_dim=16)
      c.optim.warmup_steps = 5
      c.objective.generator_scale = 0.5  # 1 head of 16 over width 16: HF's shape
      c.train.update(steps={steps}, log_every=1, eval_every=12, eval_batches=2,
                     checkpoint_every=5, keep_checkpoints=2)
  """, lines=1000, recipe="pretrain_electra")
  ref_dir, dir_ = str(tmp_path / "ref"), str(tmp_path / "killed")
  runs.run(config_file, ref_dir)
  code, _ = runs.interrupt(config_file, dir_, signal.SIGKILL, min_step=10)
  assert code == -signal.SIGKILL, "the run finished before it could be killed"
  assert "resumed from checkpoint step" in runs.run(config_file, dir_)
  ref, resumed = runs.logged_losses(ref_dir), runs.logged_losses(dir_)
  assert ref.keys() == resumed.keys()
  np.testing.assert_allclose([resumed[k] for k in sorted(ref)],
                             [ref[k] for k in sorted(ref)], rtol=1e-6)
  with open(f"{ref_dir}/metrics.jsonl") as f:
    evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
  assert 0 < evals[-1]["replaced"] < 0.16 and evals[-1]["rtd_accuracy"] > 0.5
  source = pretrained.load(ref_dir)  # fine-tuning's init_from: the discriminator
  assert sorted(source.params) == [paths.STACK, paths.TOKEN_EMBED]
  assert sorted(source.head) == [paths.DISCRIMINATOR_HEAD]
  assert any(n.startswith(paths.GENERATOR + "/") for n in source.dropped)
  assert convert.export_hf(tmp_path / "hf", source.config, source.params,
                           head=source.head) == "ElectraForPreTraining"
  # The run recorded its generator, which exports alone (what `jaxtl convert
  # --generator` writes; tests/convert_test.py checks its logits).
  generator = pretrained.load_generator(ref_dir)
  assert generator.config == electra.generator_config(source.config, 0.5)
  assert sorted(generator.params) == [paths.LM_HEAD, paths.STACK, paths.TOKEN_EMBED]
  assert convert.export_hf(tmp_path / "gen", generator.config, generator.params,
                           architecture="ElectraForMaskedLM") == "ElectraForMaskedLM"
  # What fine-tuning loads into its TaskModel: the whole backbone, shapes checked.
  task = heads.TaskModel(source.config, num_labels=3)
  abstract = nn.unbox(jax.eval_shape(task.init, jax.random.key(0),
                                     jnp.ones((1, 8), jnp.int32)))["params"]
  _, report = checkpoint.select_pretrained(abstract, {paths.BACKBONE: source.params})
  assert paths.join(paths.BACKBONE, paths.STACK, paths.EMBEDDER, paths.EMBED_PROJECT,
                    paths.KERNEL) in report["loaded"]
  assert all(not n.startswith(paths.BACKBONE + "/") for n in report["new"])


def test_a_failed_save_names_the_os_error_under_a_library_error(tmp_path, monkeypatch):
  # A disk made read-only under a save reaches Orbax as TensorStore's
  # "PERMISSION_DENIED" ValueError, or as the OS's EROFS, by timing; the
  # message says what the OS says either way.
  ckpt = checkpoint.Checkpointer(tmp_path, save_every=1, keep=3, async_save=False)
  tensorstore = ValueError("PERMISSION_DENIED: Error writing local file \"...\"")
  assert "ValueError: PERMISSION_DENIED" in str(ckpt._failure(tensorstore))  # pylint: disable=protected-access
  monkeypatch.setattr(storage, "write_error",
                      lambda directory: OSError(errno.EROFS, "Read-only file system"))
  message = str(ckpt._failure(tensorstore, step=4))  # pylint: disable=protected-access
  assert f"of step 4 into {tmp_path} failed (EROFS: Read-only file system)" in message
