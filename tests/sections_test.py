"""Typed config sections (jaxtl.sections): every shipped pretraining recipe
turns into its typed classes, every field of every class says what it
means, and a section whose keys depend on its kind builds the kind's class
from the kind's keys only."""

from __future__ import annotations

import dataclasses

import pytest

from jaxtl import objectives, recipes, sections
from jaxtl.configs import common
from jaxtl.data import sources
from jaxtl.data.config import DataConfig
from jaxtl.pretraining import config as pretrain_config
from jaxtl.pretraining.config import PretrainConfig

PRETRAINING = [(name, "") for name in recipes.names() if name.startswith("pretrain_")] + [
    ("pretrain_mlm", "stages=bert"), ("pretrain_mlm", "objective=mlm_nsp"),
    ("pretrain_mixed", "objective=mlm"), ("ulmfit", "stage=lm,task=imdb")]


def _load(name: str, arg: str = ""):
  return recipes.load(f"{recipes.RECIPES_DIR}/{name}.py" + (f":{arg}" if arg else ""))


def _classes(cls: type, seen: set[type]) -> set[type]:
  """``cls`` and every section class below it (each kind of a Kinded one)."""
  if cls in seen:
    return seen
  seen.add(cls)
  below = list(getattr(cls, "KINDS", {}).values())
  for hint in sections.field_types(cls).values():
    nested = sections.section_class(hint)
    args = getattr(hint, "__args__", ())
    below += [c for c in (nested, *(sections.section_class(a) for a in args)) if c]
  for c in below:
    _classes(c, seen)
  return seen


@pytest.mark.parametrize("name,arg", PRETRAINING)
def test_every_pretraining_recipe_builds_its_typed_sections(name, arg):
  config = _load(name, arg)
  typed = pretrain_config.of(config)
  assert isinstance(typed, PretrainConfig)
  assert type(typed.objective) is objectives.get(config.objective.name).config
  assert typed.data.source.kind == config.data.source.kind
  assert typed.data.seq_len == config.data.seq_len and typed.optim.lr == config.optim.lr
  for stage in typed.run_stages():
    assert isinstance(stage.data, DataConfig)
  assert pretrain_config.of(typed) is typed  # typed once


def test_every_field_of_every_section_has_a_meaning():
  classes = _classes(PretrainConfig, set())
  assert {sources.FileSource, sources.MixturePart, objectives.ObjectiveConfig} <= classes
  for cls in classes:
    for f in dataclasses.fields(cls):
      assert f.metadata.get("meaning", "").strip(), f"{cls.__name__}.{f.name}"


def test_a_key_without_a_meaning_is_refused():
  with pytest.raises(ValueError, match="needs a meaning"):
    sections.key(1, " ")


def test_a_kinded_section_builds_its_kind_from_the_union_of_keys():
  """The recipe's objective holds every objective's keys; the typed one has
  its kind's only, and an unknown kind names the known ones."""
  union = common.objective_config(name="electra", rtd_weight=7.0, noise_density=0.5)
  typed = sections.build(objectives.ObjectiveConfig, union, "config.objective")
  assert type(typed).__name__ == "ElectraConfig" and typed.rtd_weight == 7.0
  assert not hasattr(typed, "noise_density")
  with pytest.raises(ValueError, match="config.objective.name='nope'.*clm"):
    sections.build(objectives.ObjectiveConfig, {"name": "nope"}, "config.objective")


def test_the_recipes_sections_are_derived_from_the_classes():
  """One declaration: a field's default and meaning are the ConfigDict key's."""
  optim = common.optim_config()
  for f in dataclasses.fields(pretrain_config.OptimConfig):
    assert optim[f.name] == f.default
    assert common.optim_config.keys()[f.name].meaning == f.metadata["meaning"]
  assert set(common.source_config()) == set(sections.union_keys(
      list(dict.fromkeys(sources.SourceConfig.KINDS.values()))))


def test_a_stage_is_the_runs_sections_with_its_overrides():
  config = _load("pretrain_mlm", "stages=bert")
  typed = pretrain_config.of(config)
  first, last = typed.stages
  assert first.steps + last.steps == typed.train.steps
  assert first.data.seq_len < last.data.seq_len == typed.data.seq_len
  with config.unlocked():
    config.stages = (dict(steps=1, data=dict(seq_lenn=3)),)
  with pytest.raises(ValueError, match=r"config.stages\[0\].data.seq_lenn"):
    pretrain_config.of(config)
