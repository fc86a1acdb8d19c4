"""The transfer study end to end on tiny models, and its table and plot."""

import dataclasses
import importlib
import json

import pytest

from jaxtl.tools import transfer_study

import datadir


def _tiny(pre, data):
  with pre.unlocked():
    pre.data.source.parts = dict(shakespeare=dict(
        kind="text", files=dict(train=[str(data / "tiny_shakespeare" / "input.txt")],
                                validation=[str(data / "tiny_shakespeare" / "input.txt")])))
  pre.data.tokenizer.update(vocab_size=600)
  pre.data.update(seq_len=32, batch_size=8, max_docs=1000)
  # One layer: the study's 10 runs each compile their own steps.
  pre.model.update(num_layers=1, d_model=16, num_heads=2, head_dim=8, mlp_dim=32)
  pre.train.update(steps=2, log_every=1, eval_every=2, eval_batches=1,
                   checkpoint_every=2)


@pytest.mark.slow
def test_study_pretrains_finetunes_and_reports(tmp_path):
  pytest.importorskip("matplotlib")
  data = datadir.require_data()
  datadir.require_data("trec", "train_5500.label")
  config = importlib.import_module("jaxtl.configs.transfer_study").get_config()
  for name in ("clm", "mlm"):
    _tiny(config.pretrain[name], data)
  config.finetune.task.update(max_len=24, max_eval_examples=100)
  config.study.update(recipes=("ulmfit",), num_labels=(48,), min_steps=2,
                      min_epochs=1, seeds=(0,))
  config.study.lr.ulmfit = (1e-4, 1e-3)
  rows = transfer_study.run_study(config, str(tmp_path))
  assert {(r["model"], r["init"]) for r in rows} == {
      (m, i) for m in ("clm", "mlm") for i in ("pretrained", "random")}
  assert all(r["labels"] == 48 for r in rows)
  # Each row took the learning rate with the better dev score.
  for r in rows:
    cell = tmp_path / "finetune" / f"{r['model']}_{r['init']}_ulmfit_48"
    dev = {lr: json.loads((cell / f"seed0_lr{lr:g}" / "results.json").read_text())["best_dev"]
           for lr in (1e-4, 1e-3)}
    assert r["dev"] == max(dev.values()) and dev[r["lr"]] == r["dev"]
  # The MLM run reused the CLM run's tokenizer, and kept a copy.
  assert ((tmp_path / "pretrain_mlm" / "tokenizer").iterdir().__next__().name
          == (tmp_path / "pretrain_clm" / "tokenizer" / "spm_unigram_600.model").name)
  table = (tmp_path / "transfer.md").read_text()
  assert "| clm | pretrained | ulmfit |" in table and "48 labels" in table
  assert (tmp_path / "transfer.png").stat().st_size > 0
  # Started again, it resumes: nothing is retrained.
  assert transfer_study.run_study(config, str(tmp_path)) == rows


def test_markdown_table_has_a_column_per_budget_and_averages_seeds():
  rows = [{"model": "clm", "init": i, "recipe": "full", "labels": n, "seed": s,
           "test": {"accuracy": a}, "trainable_params": 10}
          for i, n, s, a in (("pretrained", 100, 0, 0.5), ("pretrained", 100, 1, 0.6),
                             ("pretrained", 500, 0, 0.75), ("pretrained", 500, 1, 0.75),
                             ("random", 100, 0, 0.25), ("random", 100, 1, 0.25))]
  table = transfer_study.markdown_table(rows, "accuracy").splitlines()
  assert table[0] == "Test accuracy (%), mean ± std over 2 seed(s)."
  assert table[2] == "| model | init | scheme | trainable params | 100 labels | 500 labels |"
  assert table[4] == "| clm | pretrained | full | 10 | 55.0 ± 7.1 | 75.0 ± 0.0 |"
  assert table[5] == "| clm | random | full | 10 | 25.0 ± 0.0 |  |"
  # The gain is paired by seed: (50 - 25, 60 - 25).
  assert table[-1] == "| clm | full | 30.0 ± 7.1 |  |"


def _typed_study():
  config = importlib.import_module("jaxtl.configs.transfer_study").get_config()
  return transfer_study.of(config)


def test_learning_rates_accept_a_grid_or_one_value():
  study = _typed_study().study
  assert transfer_study.learning_rates(study, "full") == (3e-4, 1e-3)
  one = dataclasses.replace(study, lr={"full": 1e-3})
  assert transfer_study.learning_rates(one, "full") == (1e-3,)


def test_a_cells_config_is_the_fine_tuning_config_with_the_cells_settings():
  datadir.require_data("trec", "train_5500.label")
  config = _typed_study()
  c = transfer_study.run_config(config, "clm", "pretrained", "ulmfit", 48, "/pre", 1e-3, 1)
  assert (c.seed, c.init_from, c.optim.lr) == (1, "/pre", 1e-3)
  assert (c.task.num_train_examples, c.task.pooling) == (48, "mean")
  assert (c.adapt.scheme, c.adapt.layer_decay) == ("full", 0.8)
  # 48 examples in batches of 32: one step an epoch, so min_steps epochs.
  assert c.train.epochs == config.study.min_steps and c.train.checkpoint_every == 0
  layers = config.pretrain["clm"].model["num_layers"]
  assert c.adapt.unfreeze_epochs == c.train.epochs / (3 * (layers + 1))
  assert config.finetune.init_from == "" and config.finetune.seed == 0  # unchanged
  with pytest.raises(ValueError, match="config.study.inits: unknown 'warm'"):
    transfer_study.run_config(config, "clm", "warm", "full", 48, "/pre", 1e-3, 0)
