"""Config values are checked up front: every recipe passes, and a value
outside its range is one error naming the key and what it allows."""

import functools
import importlib

import pytest

from jaxtl.train import config_checks
from jaxtl.train.workload import ConfigError

from configs_test import ALL_RECIPES, RECIPE_ARGS


def _config(recipe, arg=None):
  return importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg)


def _mode(config):
  """The --mode a recipe's config runs under (ulmfit gives both kinds)."""
  return "study" if "study" in config else "finetune" if "task" in config else "pretrain"


def _set(config, key, value):
  *path, last = key.split(".")
  setattr(functools.reduce(getattr, path, config), last, value)
  return config


@pytest.mark.parametrize("recipe,arg", [
    (recipe, arg) for recipe in ALL_RECIPES
    for arg in [None, *RECIPE_ARGS.get(recipe, [])]])
def test_every_recipe_passes(recipe, arg):
  config = _config(recipe, arg)
  config_checks.check_values(config, _mode(config))


@pytest.mark.parametrize("recipe,key,value,message", [
    ("pretrain_clm", "optim.lr", -0.001,
     "config.optim.lr=-0.001: must be a finite number above 0"),
    ("pretrain_clm", "optim.lr", float("nan"), "config.optim.lr=nan: must be a finite"),
    ("pretrain_clm", "optim.b2", 1.0, r"config.optim.b2=1.0: must be a number in \[0, 1\)"),
    ("pretrain_clm", "optim.eps", 0.0, "config.optim.eps=0.0"),
    ("pretrain_clm", "optim.end_lr_ratio", 2.0, "config.optim.end_lr_ratio=2.0"),
    ("pretrain_clm", "model.dropout_rate", 1.5, "config.model.dropout_rate=1.5"),
    ("pretrain_clm", "data.seq_len", 1, "config.data.seq_len=1: must be a whole number, 3"),
    ("pretrain_clm", "data.max_docs", -5, "config.data.max_docs=-5: must be a whole number, 0"),
    ("pretrain_clm", "seed", -1, "config.seed=-1"),
    ("pretrain_mlm", "objective.mask_rate", 0.0, "config.objective.mask_rate=0.0"),
    ("finetune", "task.dev_fraction", -0.5, "config.task.dev_fraction=-0.5"),
    ("finetune", "task.num_train_examples", -5, "config.task.num_train_examples=-5"),
    ("finetune", "task.max_len", 0, "config.task.max_len=0: must be a whole number, 3"),
    ("finetune", "task.max_len", True, "config.task.max_len=True"),  # not 1
    ("finetune", "task.max_target_len", 0, "config.task.max_target_len=0"),
    ("finetune", "task.head_dropout", 1.0, "config.task.head_dropout=1.0"),
    ("finetune", "adapt.lora_dropout", -0.1, "config.adapt.lora_dropout=-0.1"),
    ("finetune", "adapt.layer_decay", 2.6, r"config.adapt.layer_decay=2.6: must be a number in \(0, 1\]"),
    ("transfer_study", "finetune.optim.lr", -1.0, "config.finetune.optim.lr=-1.0"),
    ("transfer_study", "pretrain.mlm.data.seq_len", 0, "config.pretrain.mlm.data.seq_len=0"),
    ("transfer_study", "study.lr.full", (1e-3, -1.0),
     r"config.study.lr.full=\(0.001, -1.0\): each must be a finite number above 0"),
    ("transfer_study", "study.num_labels", (100, -1), "config.study.num_labels="),
])
def test_a_bad_value_names_its_key(recipe, key, value, message):
  config = _set(_config(recipe), key, value)
  with pytest.raises(ConfigError, match=message):
    config_checks.check_values(config, _mode(config))


@pytest.mark.parametrize("recipe,values,message", [
    ("finetune", {"task.dev_fraction": 0.6, "task.test_fraction": 0.5},
     r"config.task.dev_fraction=0.6 \+ config.task.test_fraction=0.5: together must be"),
    ("pretrain_mlm", {"objective.mask_token_rate": 0.8, "objective.random_token_rate": 0.3},
     "config.objective.mask_token_rate=0.8 \\+ config.objective.random_token_rate=0.3"),
])
def test_shares_that_add_up_past_one_are_named(recipe, values, message):
  config = _config(recipe)
  for key, value in values.items():
    _set(config, key, value)
  with pytest.raises(ConfigError, match=message):
    config_checks.check_values(config, _mode(config))


def test_a_stage_override_is_named_by_its_stage():
  config = _config("pretrain_mlm", "stages=bert")
  config.stages = (dict(steps=1000, data=dict(seq_len=2)), dict(steps=1000))
  with pytest.raises(ConfigError, match=r"config.stages\[0\].data.seq_len=2"):
    config_checks.check_values(config, "pretrain")


def test_a_config_of_another_mode_is_named():
  with pytest.raises(ConfigError, match=r"no data section, and `jaxtl pretrain` .*: it "
                     r"is a finetune recipe: run it with `jaxtl finetune`"):
    config_checks.check_values(_config("finetune"), "pretrain")
  with pytest.raises(ConfigError, match=r"no task section, .*it is a pretrain recipe: "
                     r"run it with `jaxtl pretrain`"):
    config_checks.check_values(_config("pretrain_clm"), "finetune")
