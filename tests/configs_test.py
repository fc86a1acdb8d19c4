"""Every config builds; overrides are checked; every recipe trains two steps."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxtl.configs import common, models
from jaxtl import objectives, train
from jaxtl.models import TransformerConfig, build_model
import datadir

REPO = pathlib.Path(__file__).resolve().parent.parent
RECIPES = sorted(p.stem for p in (REPO / "jaxtl" / "configs").glob("pretrain_*.py"))


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
  model_cfg = train.model_config_from(config, vocab_size=1000)
  assert model_cfg.vocab_size == 1024  # padded to a multiple of 128
  model = build_model(model_cfg)
  toks = jnp.ones((1, 8), jnp.int32)
  args = (toks, toks) if model_cfg.family == "encoder_decoder" else (toks,)
  shapes = jax.eval_shape(model.init, jax.random.key(0), *args)
  assert jax.tree.leaves(shapes)


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


def test_config_argument_errors():
  with pytest.raises(ValueError, match="modle"):
    common.parse_arg("modle=bert_tiny", model="gpt2_tiny")
  with pytest.raises(ValueError, match="unknown model preset"):
    models.get_model_config("bert_huge")


def _main(*args, env=None, timeout=300):
  return subprocess.run([sys.executable, "-m", "jaxtl.main", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "XLA_FLAGS": "", **(env or {})})


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
    "pretrain_mixed": ("imdb", ["--config.data.max_docs=300",
                                "--config.data.tokenizer.vocab_size=1000"]),
}


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
