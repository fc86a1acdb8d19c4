"""ULMFiT's three stages as the recipe chains them (configs/ulmfit.py): a
general causal LM, the same LM fine-tuned on TREC's questions, then the
classifier with concat pooling, discriminative rates, gradual unfreezing
and STLR. Tiny model, a few steps each."""

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.pretraining import pretrain
from jaxtl.configs import ulmfit
from jaxtl.tasks import finetune
from jaxtl.train import checkpoint, optim

import datadir
import runs


def _config_from_file(path: str):
  spec = importlib.util.spec_from_file_location("tiny_clm", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _layer_kernel(params, i):
  return np.asarray(params["stack"][f"layer_{i}"]["mlp"]["wi"]["kernel"])


@pytest.mark.slow
def test_general_lm_then_target_lm_then_classifier(tmp_path):
  datadir.require_data("trec", "train_5500.label")
  general = _config_from_file(runs.tiny_clm_config(tmp_path, """
      c.data.update(seq_len=16, batch_size=8)
      c.model.update(num_layers=2, d_model=16, num_heads=2, head_dim=8, mlp_dim=32)
      c.optim.warmup_steps = 1
      c.train.update(steps=2, log_every=1, eval_every=2, eval_batches=1,
                     checkpoint_every=2)
  """, lines=300))
  pretrain.train_and_evaluate(general, str(tmp_path / "clm"))

  lm = ulmfit.get_config("stage=lm,task=trec")
  lm.init_from = str(tmp_path / "clm")
  lm.data.update(seq_len=16, batch_size=8, max_docs=200)
  lm.train.update(steps=10, log_every=1, eval_every=10, eval_batches=1,
                  checkpoint_every=10)
  pretrain.train_and_evaluate(lm, str(tmp_path / "lm"))
  records = [json.loads(l) for l in open(tmp_path / "lm" / "metrics.jsonl")]
  rates = [r["learning_rate"] for r in records if r["split"] == "train"]
  # STLR: the first step runs at lr/32 (not 0), the second (10%) at lr.
  assert rates[:2] == pytest.approx([lm.optim.lr / 32, lm.optim.lr], rel=1e-4)

  clf = ulmfit.get_config("stage=classifier,task=trec")
  assert clf.task.pooling == "concat" and clf.optim.schedule == "stlr"
  clf.init_from = str(tmp_path / "lm")
  clf.task.update(num_train_examples=32, max_len=24, max_eval_examples=16,
                  dev_fraction=0.0)  # no selection: best/ is the last epoch
  clf.train.update(epochs=2, batch_size=8,  # 4 steps an epoch
                   length_multiple=0,  # one shape to compile
                   checkpoint_every=0)
  results = finetune.finetune_and_evaluate(clf, str(tmp_path / "trec"))
  assert "accuracy" in results["test"]
  spec = json.load(open(tmp_path / "trec" / "task.json"))
  assert spec["pooling"] == "concat"

  before = checkpoint.load_params(str(tmp_path / "lm"))
  after = checkpoint.load_params(str(tmp_path / "trec" / "best"))
  assert after["head"]["out"]["kernel"].shape == (3 * 16, 6)  # [last, max, mean]
  # Epoch 1 trains the top group; epoch 2 adds layer_1; layer_0 and the
  # embeddings are still frozen.
  assert not np.array_equal(_layer_kernel(after["backbone"], 1),
                            _layer_kernel(before, 1))
  np.testing.assert_array_equal(_layer_kernel(after["backbone"], 0),
                                _layer_kernel(before, 0))
  for name in ("token_embed", "embedder"):  # token and position embeddings
    src = before[name] if name in before else before["stack"][name]
    dst = after["backbone"][name] if name in before else after["backbone"]["stack"][name]
    jax.tree.map(np.testing.assert_array_equal, dst, src)

def test_classifier_rates_fall_by_2_6_per_layer():
  c = ulmfit.get_config("stage=classifier,task=trec")
  params = {"backbone": {"token_embed": {"embedding": jnp.ones((2, 2))},
                         "stack": {"layer_0": {"k": jnp.ones(2)},
                                   "layer_1": {"k": jnp.ones(2)}}},
            "head": {"out": {"kernel": jnp.ones(2)}}}
  c.optim.update(weight_decay=0.0, clip_norm=0.0)
  tx, schedule = optim.make_finetune_optimizer(c.optim, 100, params, 2,
                                               layer_decay=c.adapt.layer_decay)
  updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
  size = lambda x: float(jnp.abs(x).ravel()[0])  # Adam's first step: lr per unit gradient
  head = size(updates["head"]["out"]["kernel"])
  assert head == pytest.approx(float(schedule(0)), rel=1e-3)
  got = [size(updates["backbone"]["stack"]["layer_1"]["k"]) / head,
         size(updates["backbone"]["stack"]["layer_0"]["k"]) / head,
         size(updates["backbone"]["token_embed"]["embedding"]) / head]
  np.testing.assert_allclose(got, [2.6 ** -1, 2.6 ** -2, 2.6 ** -3], rtol=1e-4)
