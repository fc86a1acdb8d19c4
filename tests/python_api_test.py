"""Training from Python (``jaxtl.pretrain``, ``jaxtl.finetune``,
``jaxtl.recipes.load``) starts a run as the commands do: checked, bound to
its workdir, recorded in ``config.txt``, resumed when run again."""

import pytest

import jaxtl
import runs
from jaxtl.train import workdir as workdir_lib


def test_a_recipe_loads_by_name_and_an_unknown_one_is_named():
  config = jaxtl.recipes.load("finetune_minilm:task=sst2")
  assert config.task.name == "sst2"
  with pytest.raises(AttributeError):  # locked, as on the command line
    config.task.nope = 1
  with pytest.raises(ValueError, match="'finetun' is not a shipped recipe .*known: finetune,"):
    jaxtl.recipes.load("finetun")


def test_pretraining_from_python_is_the_commands_run(tmp_path):
  config = runs.tiny_mlm_config()
  config.train.update(steps=2, eval_every=2, eval_batches=1)
  workdir = str(tmp_path / "mlm")
  metrics = jaxtl.pretrain(config, workdir)
  assert metrics["loss"] > 0
  header = (tmp_path / "mlm" / "config.txt").read_text().splitlines()[0]
  assert header.endswith(f"jaxtl.pretrain(config, {workdir!r})")
  assert (tmp_path / "mlm" / "identity.json").is_file()
  # Its guards: another model is refused before anything is written, and a
  # rerun of the finished run resumes it.
  config.model.num_layers = 1
  with pytest.raises(workdir_lib.WorkdirConflict, match="config.model.num_layers: 2 -> 1"):
    jaxtl.pretrain(config, workdir)
  config.model.num_layers = 2
  assert jaxtl.pretrain(config, workdir)["loss"] == pytest.approx(metrics["loss"])
  with pytest.raises(ValueError, match="mode='train': expected one of pretrain, finetune"):
    jaxtl.training.run("train", config, workdir)
