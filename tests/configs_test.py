"""Every config builds; overrides are checked; library code reads every key;
every recipe trains two steps."""

import ast
import dataclasses
import functools
import importlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from jaxtl.pretraining import pretrain
from jaxtl.configs import common, models
from jaxtl import objectives
from jaxtl.models import TransformerConfig, build_model
from jaxtl.tools import transfer_study
import datadir
import runs

REPO = pathlib.Path(__file__).resolve().parent.parent
RECIPES = sorted(p.stem for p in (REPO / "configs").glob("pretrain_*.py"))
# Every recipe (a configs/*.py with get_config), and the arguments it is
# checked with besides its defaults.
ALL_RECIPES = sorted(p.stem for p in (REPO / "configs").glob("*.py")
                     if "def get_config(" in p.read_text())
FINETUNE_TASKS = ("trec", "sst2", "stsb", "pos", "squad")
RECIPE_ARGS = {
    "finetune": [f"task={t},scheme={s}" for t in FINETUNE_TASKS
                 for s in ("full", "features", "scalar_mix", "adapters", "lora")],
    "finetune_minilm": [f"task={t}" for t in FINETUNE_TASKS],
    "pretrain_mixed": ["objective=mlm"],
    "pretrain_mlm": ["stages=bert", "objective=mlm_nsp", "objective=mlm_sop"],
    "pretrain_electra": ["stages=bert"],
    "pretrain_prefix_lm": ["model=t5_tiny"],
    "ulmfit": ["stage=lm,task=imdb", "stage=classifier", "stage=classifier,task=imdb"],
}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("preset", sorted(models.PRESETS))
def test_every_recipe_and_preset_builds(recipe, preset):
  module = importlib.import_module(f"jaxtl.configs.{recipe}")
  config = module.get_config(f"model={preset}")
  assert config.model.num_layers == models.PRESETS[preset]["num_layers"]
  if objectives.get(config.objective.name).family != config.model.family:
    with pytest.raises(ValueError, match="needs a"):
      objectives.check_objective(config.objective.name, config.model.family)
    return
  model_cfg = pretrain.model_config_from(config.model, 1000, config.vocab_multiple)
  assert model_cfg.vocab_size == 1024  # padded to a multiple of 128
  model = objectives.get(config.objective.name).build_model(model_cfg, config.objective)
  toks = jnp.ones((1, 8), jnp.int32)
  args = (toks, toks) if model_cfg.family == "encoder_decoder" else (toks,)
  shapes = jax.eval_shape(model.init, jax.random.key(0), *args)
  assert jax.tree.leaves(shapes)


@pytest.mark.parametrize("objective", sorted(objectives.REGISTRY))
def test_every_objective_has_a_recipe_whose_model_it_fits(objective):
  recipe, arg = {"clm": ("pretrain_clm", None), "span": ("pretrain_span", None),
                 "electra": ("pretrain_electra", None), "bart": ("pretrain_bart", None),
                 "prefix_lm": ("pretrain_prefix_lm", None),
                 "prefix_lm_encdec": ("pretrain_prefix_lm", "model=t5_tiny"),
                 }.get(objective, ("pretrain_mlm", f"objective={objective}"))
  config = importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg)
  assert config.objective.name == objective
  model_cfg = pretrain.model_config_from(config.model, 1000, config.vocab_multiple)
  objectives.check_objective(objective, model_cfg.family)
  objectives.check_model(objective, model_cfg)
  toks = jnp.ones((1, 8), jnp.int32)
  args = (toks, toks) if model_cfg.family == "encoder_decoder" else (toks,)
  out = jax.eval_shape(lambda: build_model(model_cfg).init_with_output(
      jax.random.key(0), *args)[0])
  assert ("sentence_logits" in out) == objective.startswith("mlm_")


def test_presets_have_the_published_sizes():
  """Parameter counts of the big presets against the published models."""
  def count(name, vocab):
    cfg = TransformerConfig.from_mapping({**models.get_model_config(name),
                                          "vocab_size": vocab, "attention_impl": ""})
    model = build_model(cfg)
    toks = jnp.ones((1, 8), jnp.int32)
    args = (toks, toks) if cfg.family == "encoder_decoder" else (toks,)
    shapes = jax.eval_shape(model.init, jax.random.key(0), *args)
    return sum(x.size for x in jax.tree.leaves(shapes))
  assert count("gpt2_small", 50257) == pytest.approx(124.4e6, rel=0.01)
  assert count("bert_base", 30522) == pytest.approx(110e6, rel=0.02)  # no pooler
  assert count("t5_small", 32128) == pytest.approx(60.5e6, rel=0.01)
  assert count("bart_base", 50265) == pytest.approx(139.4e6, rel=0.01)


def test_config_argument_errors():
  with pytest.raises(ValueError, match="modle"):
    common.parse_arg("modle=bert_tiny", model="gpt2_tiny")
  with pytest.raises(ValueError, match="unknown model preset"):
    models.get_model_config("bert_huge")


def test_sections_take_new_values_but_no_new_keys():
  assert common.optim_config(lr=3e-4, end_lr_ratio=0).end_lr_ratio == 0.0
  with pytest.raises(AttributeError, match="lrr"):
    common.optim_config(lrr=1.0)
  with pytest.raises(AttributeError, match="stepz"):
    common.pretrain_config("bert_tiny").train.stepz = 1
  with pytest.raises(TypeError, match="steps"):
    common.pretrain_train_config(steps="abc")


# ----------------------------------------------------------------------------
# Every key of every recipe is read by library code.


@functools.cache
def _library_reads() -> frozenset[str]:
  """Names that library code (jaxtl/ outside configs/) reads off something:
  ``x.name``, ``x["name"]``, ``x.get("name", ...)``, ``getattr(x, "name")``."""
  names = set()
  for path in (REPO / "jaxtl").rglob("*.py"):
    if path.parent.name == "configs":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        names.add(node.attr)
      elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        names.add(getattr(node.slice, "value", None))
      elif isinstance(node, ast.Call):
        func = getattr(node.func, "attr", getattr(node.func, "id", None))
        at = {"get": 0, "pop": 0, "getattr": 1, "hasattr": 1}.get(func)
        if at is not None and len(node.args) > at:
          names.add(getattr(node.args[at], "value", None))
  return frozenset(n for n in names if isinstance(n, str))


def _map_names(config: ml_collections.ConfigDict, path: tuple[str, ...]
               ) -> set[str] | None:
  """For a section whose keys are names its reader looks things up by (not
  settings), the names that can be looked up; None for other sections."""
  at = lambda p: functools.reduce(lambda c, k: c[k], p, config)
  if path[-1:] == ("files",):  # split -> paths (jaxtl.data.sources)
    data = at(path[:path.index("source")])
    return {data.train_split, data.eval_split}
  if path[-1:] in (("parts",), ("rules",)):  # every mixture part / axis rule is used
    return set(at(path))
  if path in (("pretrain",), ("study", "pooling")):  # transfer study: per backbone
    return set(config.study.models)
  if path == ("study", "lr"):
    return set(transfer_study.RECIPES)
  return None


MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(TransformerConfig))


def unread_keys(config: ml_collections.ConfigDict) -> list[str]:
  """Dotted keys of ``config`` that no library code reads.

  ``model.*`` keys are read by ``TransformerConfig.from_mapping`` (so they
  must be its fields), entries of a name-keyed section (``_map_names``) by
  the lookup of their name, and any other key by code that reads a
  ``.name`` (``_library_reads``).
  """
  reads, unread = _library_reads(), []

  def walk(node, path):
    names = _map_names(config, path) if path else None
    for key, value in node.items():
      if names is not None:
        known = key in names
      elif path[-1:] == ("model",):
        known = key in MODEL_FIELDS
      else:
        known = key in reads
      if not known:
        unread.append(".".join((*path, key)))
      elif isinstance(value, ml_collections.ConfigDict):
        walk(value, (*path, key))

  walk(config, ())
  return unread


@pytest.mark.parametrize("recipe,arg", [
    (recipe, arg) for recipe in ALL_RECIPES
    for arg in [None, *RECIPE_ARGS.get(recipe, [])]])
def test_library_code_reads_every_key(recipe, arg):
  unread = unread_keys(importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg))
  assert not unread, (f"configs/{recipe}.py:{arg or ''}: nothing in jaxtl/ reads "
                      f"these keys: {unread}")


def test_every_key_can_be_set_from_the_command_line():
  """ml_collections overrides booleans, numbers, strings and tuples, not
  lists: a recipe's file lists once could only be changed in a config file."""
  from jaxtl.train import identity  # pylint: disable=g-import-not-at-top
  lists = [f"{recipe}:{arg or ''} {key}" for recipe in ALL_RECIPES
           for arg in [None, *RECIPE_ARGS.get(recipe, [])]
           for key, value in identity.leaves(
               importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg))
           if isinstance(value, list)]
  assert not lists


def test_a_recipe_reads_local_files_named_on_the_command_line(tmp_path):
  """Any pretraining recipe, TFDS's included, reads files named by flags:
  one path, or the flag repeated."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from jaxtl.data import sources  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import config as pretrain_config  # pylint: disable=g-import-not-at-top
  argv = ["jaxtl", f"--config={REPO}/configs/pretrain_clm.py",
          "--config.data.source.kind=text", "--config.data.source.files.train=a.txt",
          "--config.data.source.files.train=b.txt",
          "--config.data.source.files.validation=c.txt"]
  values = flags.FlagValues()  # the overrides' flags are made from sys_argv
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
  values(argv)
  source = pretrain_config.of(values.config).data.source
  assert isinstance(source, sources.FileSource) and source.kind == "text"
  assert source.files == {"train": ("a.txt", "b.txt"), "validation": ("c.txt",)}
  (tmp_path / "a.txt").write_text("one line\n")
  with pytest.raises(FileNotFoundError, match=r"b.txt \(a file of split 'train'\)"):
    sources.check_files(dataclasses.replace(source, files={
        "train": (str(tmp_path / "a.txt"), str(tmp_path / "b.txt"))}), ("train",))


def test_the_unread_key_check_names_dead_keys():
  config = importlib.import_module("jaxtl.configs.transfer_study").get_config()
  with config.unlocked():
    config.finetune.optim.accum_stepz = 1
    config.pretrain.clm.model.num_layerz = 1
    config.pretrain.mlm.data.source.parts.imdb.files.test = ["x"]
    config.study.lr.sgd = (1.0,)
  assert sorted(unread_keys(config)) == [
      "finetune.optim.accum_stepz", "pretrain.clm.model.num_layerz",
      "pretrain.mlm.data.source.parts.imdb.files.test", "study.lr.sgd"]


def _main(*args, env=None, timeout=300):
  return subprocess.run([sys.executable, "-m", "jaxtl", "pretrain", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "XLA_FLAGS": runs.XLA_FLAGS, **(env or {})})


@pytest.mark.subprocess
def test_unknown_override_key_and_bad_type_are_named(tmp_path):
  bad_key = _main("--config=configs/pretrain_clm.py", "--config.optim.lrr=1",
                  f"--workdir={tmp_path}")
  assert bad_key.returncode != 0 and "lrr" in bad_key.stderr
  bad_type = _main("--config=configs/pretrain_clm.py", "--config.train.steps=abc",
                   f"--workdir={tmp_path}")
  assert bad_type.returncode != 0 and "steps" in bad_type.stderr


TWO_STEPS = ["--config.train.steps=2", "--config.train.log_every=1",
             "--config.train.eval_every=2", "--config.train.eval_batches=1",
             "--config.data.batch_size=8", "--config.data.seq_len=32",
             "--config.model.num_layers=1"]
RECIPE_DATA = {
    "pretrain_clm": ("tiny_shakespeare",
                     ["--config.data.tokenizer.vocab_size=300"]),
    "pretrain_mlm": ("imdb", ["--config.data.max_docs=500",
                              "--config.data.tokenizer.vocab_size=1000"]),
    "pretrain_span": ("wikitext2", []),
    "pretrain_electra": ("imdb", ["--config.data.max_docs=500",
                                  "--config.data.tokenizer.vocab_size=1000"]),
    "pretrain_bart": ("wikitext2", []),
    "pretrain_prefix_lm": ("wikitext2", []),
    "pretrain_mixed": ("imdb", ["--config.data.max_docs=300",
                                "--config.data.tokenizer.vocab_size=1000"]),
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_two_steps_on_real_data(recipe, tmp_path):
  folder, extra = RECIPE_DATA[recipe]
  data = datadir.require_data(folder).parent
  if recipe == "pretrain_clm":
    pytest.importorskip("tensorflow_datasets")
  result = _main(f"--config=configs/{recipe}.py", f"--workdir={tmp_path}",
                 *TWO_STEPS, *extra, env={"JAXTL_DATA_DIR": str(data),
                                          "TFDS_DATA_DIR": str(tmp_path / "tfds")})
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  splits = [r["split"] for r in records]
  assert splits.count("train") == 2 and "eval" in splits
  assert all(r["loss"] > 0 for r in records if r["split"] != "info")
  assert (tmp_path / "checkpoints" / "2").is_dir()
