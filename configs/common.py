"""The recipes' skeletons: every config section as a locked ConfigDict,
the ``:key=value`` parser, and :func:`describe`.

A key is declared once, where library code reads it: as a field of a typed
section (``jaxtl.sections.key(default, meaning)`` in ``OptimConfig``,
``DataConfig``, an objective's or a corpus kind's class, ...). Each section
here is derived from its class (:func:`from_class`): its keys, defaults and
meanings; a section whose keys depend on its kind (the objective, the
corpus) holds every kind's keys. So a misspelt override
(``--config.optim.lrr=1``) or a wrong type fails loudly, naming the key,
``jaxtl config RECIPE`` says what every key means, and the run turns the
ConfigDict back into the typed classes once (``jaxtl.pretraining.config.of``,
``jaxtl.tasks.config.of``). Sections come back locked: recipes change
values, they never add keys. tests/configs_test.py checks that library
code reads every key, tests/config_meanings_test.py that every key of every
recipe has a meaning.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from jaxtl import objectives, sections
from jaxtl.configs import models
from jaxtl.data.config import DataConfig, TokenizerConfig
from jaxtl.data.sources import MixturePart, SourceConfig
from jaxtl.pretraining.config import PretrainConfig, PretrainTrainConfig
from jaxtl.tasks.config import (AdaptConfig, FinetuneConfig, FinetuneTrainConfig,
                                HFDatasetConfig, StudyConfig, TaskConfig,
                                TransferStudyConfig)
from jaxtl.train.optim import OptimConfig
from jaxtl.train.sharding import MeshConfig

ConfigDict = ml_collections.ConfigDict


def parse_arg(arg: str | None, **defaults: Any) -> ConfigDict:
  """``"model=gpt2_tiny,steps=10"`` -> ConfigDict, typed by ``defaults``."""
  values = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in defaults:
      raise ValueError(f"config argument {item!r}: expected key=value with a "
                       f"key in {sorted(defaults)}")
    values[key] = type(defaults[key])(value)
  return ConfigDict(values)


def data_dir_path(*parts: str) -> str:
  """A path under $JAXTL_DATA_DIR, or "" when the variable is unset."""
  root = os.environ.get("JAXTL_DATA_DIR", "")
  return os.path.join(root, *parts) if root else ""


# ----------------------------------------------------------------------------
# The schema: a section declares each key as a Key, a nested Section, or a
# Map of entries the user names.


@dataclasses.dataclass(frozen=True)
class Key:
  """One setting: its default and what it means, a short line for a person
  at the command line ("peak learning rate, reached after warmup")."""
  default: Any
  meaning: str

  def __post_init__(self):
    if not self.meaning.strip():
      raise ValueError(f"Key({self.default!r}): a key needs a meaning")


@dataclasses.dataclass(frozen=True)
class Map:
  """A key whose entries the user names (splits, mixture parts, mesh axes):
  ``entry`` is each entry's meaning (``{name}``: the entry's name), or the
  Section each entry is."""
  default: dict[str, Any]
  entry: str | Section


class Section:
  """A config section, declared by a function that returns its keys.

  Calling the section gives its locked ConfigDict: ``overrides`` change
  values (type-checked; a nested section takes a dict, key by key), never
  add keys. ``keys()`` gives the declarations, which :func:`describe` reads.
  """

  def __init__(self, declare: Callable[[], Keys]):
    self.keys = declare
    functools.update_wrapper(self, declare)

  def __call__(self, **overrides: Any) -> ConfigDict:
    keys = self.keys()
    c = ConfigDict({name: _default(node) for name, node in keys.items()})
    c.lock()
    for name, value in overrides.items():
      if isinstance(keys.get(name), Section) and isinstance(value, (dict, ConfigDict)):
        c[name].update(value)  # replacing it would unlock it
      else:
        setattr(c, name, value)
    return c


Keys = dict[str, Key | Section | Map]


def _default(node: Key | Section | Map) -> Any:
  """A declaration's value in a fresh ConfigDict (a nested section, built)."""
  if isinstance(node, Section):
    return node()
  return dict(node.default) if isinstance(node, Map) else node.default


# ----------------------------------------------------------------------------
# Sections derived from the typed classes.


@functools.cache
def from_class(cls: type) -> Section:
  """The ConfigDict section of typed section class ``cls``: a Key per
  field, a nested Section per section field, a Map per dict field (of
  sections, or of values the user names); a Kinded class's kinds' keys,
  all of them."""
  def declare() -> Keys:
    return _union(cls) if issubclass(cls, sections.Kinded) else _keys(cls)
  declare.__doc__ = cls.__doc__
  return Section(declare)


def _keys(cls: type) -> Keys:
  hints, out = sections.field_types(cls), {}
  for name, f in sections.fields(cls).items():
    if f.metadata.get("inline"):  # a mixture part's source: its keys beside rate
      out.update(from_class(hints[name]).keys())
    else:
      out[name] = _node(hints[name], f)
  return out


def _node(hint: Any, f: dataclasses.Field) -> Key | Section | Map:
  """A field's declaration."""
  meaning = f.metadata.get("meaning", "")
  nested = sections.section_class(hint)
  if nested is not None:
    return from_class(nested)
  default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
  if typing.get_origin(hint) in (dict, Mapping):
    entry = sections.section_class(typing.get_args(hint)[1])
    return Map(default, from_class(entry) if entry else meaning)
  return Key(default, meaning)


def _union(cls: type[sections.Kinded]) -> Keys:
  """A Kinded section's keys: every kind's, each meaning prefixed with the
  kinds that read it when not all do ("mlm, electra: share of tokens ...")."""
  names: dict[type, list[str]] = {}
  for kind, kind_cls in cls.KINDS.items():
    names.setdefault(kind_cls, []).append(kind)
  out: Keys = {}
  for name, (f, owners) in sections.union_keys(list(names)).items():
    if name == cls.KIND_KEY:
      out[name] = Key(f.default, f"{f.metadata['meaning']}: {' | '.join(cls.KINDS)}")
      continue
    by_meaning: dict[str, list[str]] = {}
    for owner in owners:
      meta = sections.fields(owner)[name].metadata
      by_meaning.setdefault(meta["meaning"], []).extend(meta["kinds"] or names[owner])
    readers = [kind for kinds in by_meaning.values() for kind in kinds]
    if len(readers) == len(cls.KINDS) and len(by_meaning) == 1:
      text = next(iter(by_meaning))
    else:
      text = "; ".join(f"{', '.join(kinds)}: {m}" for m, kinds in by_meaning.items())
    node = _node(sections.field_types(owners[0])[name], f)
    out[name] = (Key(node.default, text) if isinstance(node, Key)
                 else Map(node.default, node.entry if isinstance(node.entry, Section)
                          else text))
  return out


# ----------------------------------------------------------------------------
# Sections both skeletons use.


@Section
def model_config() -> Keys:
  """The backbone: every TransformerConfig field (jaxtl.models.config says
  what each means); recipes start from a preset of jaxtl.configs.models."""
  return {name: Key(default, meaning)
          for name, (default, meaning) in models.fields().items()}


optim_config = from_class(OptimConfig)
mesh_config = from_class(MeshConfig)


# ----------------------------------------------------------------------------
# Pretraining.


objective_config = from_class(objectives.ObjectiveConfig)
source_config = from_class(SourceConfig)
mixture_part = from_class(MixturePart)
tokenizer_config = from_class(TokenizerConfig)
data_config = from_class(DataConfig)
pretrain_train_config = from_class(PretrainTrainConfig)


@Section
def _pretraining() -> Keys:
  """The pretraining skeleton's keys (jaxtl.pretraining.config.PretrainConfig)."""
  return {**from_class(PretrainConfig).keys(), "model": model_config}


def pretrain_config(model: str) -> ConfigDict:
  """The pretraining skeleton every pretrain_*.py recipe starts from, with
  the backbone of preset ``model``."""
  return _pretraining(model=models.get_model_config(model))


def use_wikitext2(c: ConfigDict) -> ConfigDict:
  """Points a pretraining config at local WikiText-2: the recipes train on
  its test.txt (2,891 lines, small enough for a CPU) and evaluate on
  valid.txt, with a 4k unigram sentencepiece trained on it, 128-token rows."""
  wiki = lambda name: "{data_dir}/wikitext2/" + name
  c.data.source.update(kind="text")
  c.data.source.files = dict(train=(wiki("test.txt"),), validation=(wiki("valid.txt"),))
  c.data.tokenizer.update(vocab_size=4000, model_type="unigram")
  c.data.seq_len = 128
  return c


# ----------------------------------------------------------------------------
# Fine-tuning.


hf_spec = from_class(HFDatasetConfig)
task_config = from_class(TaskConfig)
adapt_config = from_class(AdaptConfig)
finetune_train_config = from_class(FinetuneTrainConfig)


@Section
def _finetuning() -> Keys:
  """The fine-tuning skeleton's keys (jaxtl.tasks.config.FinetuneConfig)."""
  return {**from_class(FinetuneConfig).keys(), "model": model_config}


def finetune_config(model: str) -> ConfigDict:
  """The fine-tuning skeleton finetune*.py recipes start from; ``model``
  (a preset) is only used without init_from."""
  return _finetuning(model=models.get_model_config(model),
                     optim=dict(warmup_steps=50, schedule="linear", end_lr_ratio=0.0,
                                b2=0.999))


# ----------------------------------------------------------------------------
# The transfer study (jaxtl.tools.transfer_study).


study_config = from_class(StudyConfig)


@Section
def _transfer_study() -> Keys:
  """configs/transfer_study.py's keys (jaxtl.tasks.config.TransferStudyConfig):
  a pretraining config per backbone, the fine-tuning config every cell
  starts from, the grid."""
  return {**from_class(TransferStudyConfig).keys(),
          "pretrain": Map({}, _pretraining), "finetune": _finetuning}


# ----------------------------------------------------------------------------
# What each key of a config means.


class UndocumentedKey(ValueError):
  """Config keys that no section declares, so nothing can tell a user what
  they mean; ``keys`` lists them all, not only the first."""

  def __init__(self, keys: Sequence[str]):
    self.keys = list(keys)
    super().__init__(f"no meaning is declared for {', '.join(self.keys)}: declare "
                     "each as Key(default, meaning) in jaxtl.configs.common")


def skeleton(config: Any) -> Section | None:
  """The skeleton a config was built from, by its sections: a fine-tuning
  config has a task, a pretraining config an objective, the transfer study
  a study grid. (Both skeletons have train.checkpoint_every, in epochs for
  one and steps for the other.)"""
  for section, root in (("task", _finetuning), ("objective", _pretraining),
                        ("study", _transfer_study)):
    if section in config:
      return root
  return None  # not a jaxtl skeleton: no key is declared


def _below(node: Key | Section | Map | None, name: str) -> Key | Section | Map | None:
  """The declaration of key ``name`` inside ``node``."""
  if isinstance(node, Section):
    return node.keys().get(name)
  if isinstance(node, Map):
    entry = node.entry
    return Key(None, entry.replace("{name}", name)) if isinstance(entry, str) else entry
  return None  # a leaf has nothing below it


def meaning(root: Section | None, key: str) -> str:
  """What dotted ``key`` means in configs of ``root``; "" when undeclared."""
  node = root
  for name in key.split("."):
    node = _below(node, name)
  return node.meaning if isinstance(node, Key) else ""


def describe(config: Any, *, strict: bool = True) -> list[tuple[str, Any, str]]:
  """(dotted key, value, meaning) for every leaf of a resolved recipe
  config, in jaxtl.train.identity.leaves order.

  Raises UndocumentedKey naming every leaf without a meaning; with
  ``strict=False`` its meaning is "" instead (a user's own config file may
  carry keys of its own).
  """
  from jaxtl.train.identity import leaves  # pylint: disable=g-import-not-at-top
  root = skeleton(config)
  rows = [(key, value, meaning(root, key)) for key, value in leaves(config)]
  missing = [key for key, _, text in rows if not text]
  if missing and strict:
    raise UndocumentedKey(missing)
  return rows
