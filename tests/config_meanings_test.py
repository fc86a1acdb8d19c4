"""Every key of every shipped recipe says what it means, declared where the
key is (jaxtl.configs.common, TransformerConfig's fields), and ``jaxtl
config`` shows it."""

from __future__ import annotations

import dataclasses

import pytest

from jaxtl.programs import cli
from jaxtl import recipes
from jaxtl.configs import common
from jaxtl.models import TransformerConfig
from jaxtl.train.identity import leaves

# Every recipe as it comes, and the arguments that change which keys it has.
VARIANTS = [*((name, "") for name in recipes.names()),
            ("finetune", "task=files"), ("finetune", "task=squad"),
            ("finetune_minilm", "task=files"), ("pretrain_mlm", "stages=bert"),
            ("pretrain_mlm", "objective=mlm_nsp"), ("pretrain_mixed", "objective=mlm"),
            ("ulmfit", "stage=lm,task=imdb"), ("ulmfit", "stage=classifier")]


def _load(name: str, arg: str = ""):
  return recipes.load(f"{recipes.RECIPES_DIR}/{name}.py" + (f":{arg}" if arg else ""))


@pytest.mark.parametrize("name,arg", VARIANTS)
def test_every_key_of_every_recipe_has_a_meaning(name, arg):
  config = _load(name, arg)
  rows = common.describe(config)
  assert [(key, value) for key, value, _ in rows] == list(leaves(config))
  assert all(meaning.strip() for _, _, meaning in rows)


def test_the_transfer_study_is_its_two_skeletons_and_its_grid():
  """``pretrain.NAME`` are pretraining configs, ``finetune`` a fine-tuning
  one: the same key means what it means in each (steps vs epochs)."""
  study = _load("transfer_study")
  meanings = {key: meaning for key, _, meaning in common.describe(study)}
  assert meanings["pretrain.clm.train.checkpoint_every"].startswith("steps between")
  assert meanings["finetune.train.checkpoint_every"].startswith("epochs between")
  assert meanings["study.lr.lora"] == ("learning rates tried with recipe lora, the "
                                       "best on dev kept")
  for sub in ("pretrain.mlm", "finetune"):
    config = study.pretrain.mlm if sub == "pretrain.mlm" else study.finetune
    assert [(f"{sub}.{k}", v, m) for k, v, m in common.describe(config)] == \
        [row for row in common.describe(study) if row[0].startswith(sub + ".")]


def test_named_entries_take_their_maps_meaning():
  config = _load("pretrain_mixed")
  with config.unlocked():
    config.mesh.rules.embed = ("fsdp",)
  meanings = {key: meaning for key, _, meaning in common.describe(config)}
  assert meanings["mesh.rules.embed"].startswith("mesh axes logical axis embed ")
  assert meanings["data.source.parts.wikitext2.files.validation"].endswith(
      ": the files of split validation ({data_dir}: $JAXTL_DATA_DIR)")
  assert meanings["data.source.parts.imdb.rate"].startswith("mixing=rates:")


def test_undocumented_keys_are_each_named():
  config = _load("pretrain_mixed")
  with config.unlocked():
    config.optim.lrr = 1.0
    config.model.num_layerz = 2
    config.data.source.parts.imdb.colour = "red"
    config.notes = "mine"
  with pytest.raises(common.UndocumentedKey) as error:
    common.describe(config)
  assert isinstance(error.value, ValueError)
  assert error.value.keys == ["data.source.parts.imdb.colour", "model.num_layerz",
                              "notes", "optim.lrr"]
  assert all(key in str(error.value) for key in error.value.keys)
  # jaxtl config still lists a user's own keys, without a meaning.
  assert "--config.notes='mine'  (str)" in recipes.table(config, "notes").splitlines()


def test_a_config_of_no_skeleton_has_no_meanings():
  with pytest.raises(common.UndocumentedKey, match="steps"):
    common.describe(common.ConfigDict(dict(steps=1)))


def test_meanings_are_declared_with_the_keys():
  """A Key needs a meaning; every TransformerConfig field has one."""
  with pytest.raises(ValueError, match="needs a meaning"):
    common.Key(1, " ")
  fields = dataclasses.fields(TransformerConfig)
  assert list(common.model_config.keys()) == [f.name for f in fields]
  assert all(f.metadata["meaning"].strip() for f in fields)


def test_jaxtl_config_shows_each_keys_meaning(capsys):
  cli.run(["jaxtl", "config", "pretrain_mlm", "--filter=optim.l"])
  assert capsys.readouterr().out.splitlines() == [
      "--config.optim.lr=0.002  (float)  peak learning rate, reached after warmup"]
  cli.run(["jaxtl", "config", "finetune:task=files", "--filter=train.checkpoint"])
  assert capsys.readouterr().out.strip() == (
      "--config.train.checkpoint_every=1.0  (float)  epochs between resumable "
      "checkpoints (fractions save mid-epoch); 0: none periodically")
  cli.run(["jaxtl", "config", "finetune_minilm:task=files", "--filter=task"])
  lines = capsys.readouterr().out.splitlines()
  rows = [row for row in common.describe(_load("finetune_minilm", "task=files"))
          if row[0].startswith("task")]
  assert len(lines) == len(rows) and all(
      line.startswith(f"--config.{key}=") and line.endswith(f"  {meaning}")
      for line, (key, _, meaning) in zip(lines, rows))
  assert len({line.index("  (") for line in lines}) == 1  # types in a column
  assert len({line.index(meaning) for line, (_, _, meaning) in zip(lines, rows)}) == 1
