"""Typed fine-tuning and transfer-study configs (jaxtl.tasks.config,
jaxtl.tools.transfer_study): every shipped fine-tuning recipe and variant
turns into its typed classes with every value it set, and every field of
every class says what it means."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from jaxtl import sections
from jaxtl.configs import common
from jaxtl.pretraining.config import PretrainConfig
from jaxtl.tasks import config as tasks_config
from jaxtl.tools import transfer_study
from jaxtl.train import identity
from jaxtl.train.optim import OptimConfig

from configs_test import ALL_RECIPES, RECIPE_ARGS

CLASSES = (tasks_config.HFDatasetConfig, tasks_config.TaskConfig, tasks_config.AdaptConfig,
           tasks_config.FinetuneTrainConfig, tasks_config.FinetuneConfig,
           transfer_study.StudyConfig, transfer_study.TransferStudyConfig)


def _recipes(section: str) -> list[tuple[str, str | None]]:
  """(recipe, argument) of every shipped recipe and variant whose config
  has ``section`` (``task``: fine-tuning; ``study``: the transfer study)."""
  out = []
  for recipe in ALL_RECIPES:
    for arg in (None, *RECIPE_ARGS.get(recipe, [])):
      if section in importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg):
        out.append((recipe, arg))
  return out


FINETUNING = _recipes("task")
STUDIES = _recipes("study")


def test_the_fine_tuning_recipes_are_found():
  assert {r for r, _ in FINETUNING} >= {"finetune", "finetune_minilm", "ulmfit"}
  assert ("ulmfit", "stage=classifier") in FINETUNING
  assert STUDIES == [("transfer_study", None)]


@pytest.mark.parametrize("recipe,arg", FINETUNING)
def test_every_fine_tuning_recipe_builds_its_typed_config(recipe, arg):
  config = importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg)
  typed = tasks_config.of(config)
  assert isinstance(typed, tasks_config.FinetuneConfig)
  assert isinstance(typed.task.hf, tasks_config.HFDatasetConfig)
  assert isinstance(typed.optim, OptimConfig) and isinstance(typed.model, dict)
  # Every key and value of the recipe, and nothing else.
  assert identity.flatten(typed) == identity.flatten(config)
  assert tasks_config.of(typed) is typed  # typed once


def test_text_fields_take_a_comma_list_as_predict_does():
  """--config.task.text_fields=premise,hypothesis (a tuple flag gives
  ('premise,hypothesis',)) names two fields, as predict's --text_fields."""
  task = lambda *fields: tasks_config.TaskConfig(text_fields=fields).text_fields
  assert task("premise,hypothesis") == task("premise", "hypothesis") == (
      "premise", "hypothesis")
  assert task("question") == ("question",)


def test_labels_take_a_comma_list_and_keep_a_comma_inside_a_named_label():
  """--config.task.labels=low,mid,high gives ('low,mid,high',) and 1,2,3
  gives (1, 2, 3); "('a, b', 'c')" names a label with a comma in it."""
  labels = lambda *names: tasks_config.TaskConfig(labels=names).labels
  assert labels("low, mid,high") == labels("low", "mid", "high") == (
      "low", "mid", "high")
  assert labels(1, 2, 3) == (1, 2, 3) and labels("neg") == ("neg",)
  assert labels("a, b", "c") == ("a, b", "c") and labels() == ()


@pytest.mark.parametrize("recipe,arg", STUDIES)
def test_the_transfer_study_builds_its_typed_config(recipe, arg):
  config = importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg)
  typed = transfer_study.of(config)
  assert isinstance(typed.finetune, tasks_config.FinetuneConfig)
  assert identity.flatten(typed.finetune) == identity.flatten(config.finetune)
  assert identity.flatten(typed.study) == identity.flatten(config.study)
  assert set(typed.pretrain) == set(config.pretrain) == set(typed.study.models)
  for name, pre in typed.pretrain.items():
    assert isinstance(pre, PretrainConfig)
    assert pre.train.steps == config.pretrain[name].train.steps
  assert transfer_study.of(typed) is typed


def test_the_skeletons_defaults_are_the_classes():
  """The recipes' skeleton is the classes' defaults, but for the model
  preset and the optimizer settings it overrides."""
  typed = tasks_config.of(common.finetune_config("bert_tiny"))
  expected = tasks_config.FinetuneConfig(
      model=typed.model, optim=dataclasses.replace(
          OptimConfig(), warmup_steps=50, schedule="linear", end_lr_ratio=0.0, b2=0.999))
  assert typed == expected
  assert sections.build(transfer_study.StudyConfig, common.study_config()) == \
      transfer_study.StudyConfig()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_has_a_meaning(cls):
  for f in dataclasses.fields(cls):
    assert f.metadata.get("meaning", "").strip(), f"{cls.__name__}.{f.name}"


def test_a_field_without_a_meaning_is_refused():
  with pytest.raises(ValueError, match="needs a meaning"):
    sections.key(1, "")


@pytest.mark.parametrize("key,value", [("train", "mine.csv"), ("format", "tsv"),
                                       ("test_fraction", 0.1)])
def test_a_file_named_for_a_built_in_task_is_a_mistake_naming_the_files_task(key, value):
  """task=trec with --config.task.train=mine.csv would read TREC and ask for
  JAXTL_DATA_DIR; the typed config names the key and the fix instead."""
  config = importlib.import_module("jaxtl.configs.finetune").get_config("task=sst2")
  config.task[key] = value
  with pytest.raises(ValueError, match=rf"config.task.{key}=.* is read by the files "
                                       r"task only, and this run's task is sst2: add "
                                       r"task=files"):
    tasks_config.of(config)
  config.task.name = "files"
  assert getattr(tasks_config.of(config).task, key) == value
