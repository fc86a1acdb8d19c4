"""Packed fine-tuning batches (jaxtl.tasks.packing): the loss and gradients
of one example per row, on fewer positions, in fewer shapes."""

import jax
import numpy as np
import pytest

from jaxtl.models import TransformerConfig
from jaxtl.models.config import input_side
from jaxtl.models.heads import TaskModel
from jaxtl.tasks import config as tasks_config
from jaxtl.tasks import features, finetune, packing, train_plan

BASE = dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, mlp_dim=32,
            num_layers=2, max_len=32, dropout_rate=0.0)
FAMILIES = {
    "encoder": dict(family="encoder", type_vocab_size=2, pre_norm=False, embed_norm=True),
    "decoder": dict(family="decoder"),
    "encoder_decoder": dict(family="encoder_decoder", position="relative",
                            norm="rmsnorm", use_bias=False),
}


def _batch(family, lengths, t=24, pairs=False, regression=False, seed=0):
  """One example per row, as fine-tuning's features lay them out."""
  rng = np.random.default_rng(seed)
  n = len(lengths)
  tokens, types = np.zeros((n, t), np.int32), np.zeros((n, t), np.int32)
  for i, length in enumerate(lengths):
    tokens[i, :length] = rng.integers(1, 64, length)
    if pairs:
      types[i, length // 2:length] = 1
  labels = (rng.normal(size=n).astype(np.float32) if regression
            else rng.integers(0, 3, n).astype(np.int32))
  return features.inputs(tokens, types, 0, family, labels, np.ones(n, np.float32))


def test_first_fit_fills_rows_without_overlap_or_overflow():
  rng = np.random.default_rng(0)
  for _ in range(20):
    lengths = rng.integers(1, 30, rng.integers(1, 40))
    rows, starts = packing.first_fit(lengths, 32)
    ends = starts + lengths
    assert ends.max() <= 32 and starts.min() >= 0
    for r in np.unique(rows):
      spans = sorted(zip(starts[rows == r], ends[rows == r]))
      assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    fewest = -(-lengths.sum() // 32)  # no row half empty but one: at most twice
    assert fewest <= packing.rows_needed(lengths, 32) <= 2 * fewest
  assert packing.rows_needed(np.array([20, 12, 10, 22, 30, 2]), 32) == 3  # all full
  with pytest.raises(ValueError, match="40 tokens does not fit rows of 32"):
    packing.first_fit(np.array([40, 3]), 32)


def test_a_packed_batch_holds_each_example_once_with_its_own_segment_and_positions():
  lengths = [5, 12, 3, 7, 9, 2]
  batch = _batch("encoder", lengths, pairs=True)
  table = np.arange(len(lengths) + 1)
  table[2] = 3  # a batch that packs into 2 rows gets 3
  packed = packing.pack_batch(batch, "encoder", 20, table)
  assert packed["encoder_input_tokens"].shape == (3, 20)
  np.testing.assert_array_equal(packed["labels"], batch["labels"])
  for i, (r, s, e) in enumerate(zip(*(packed[k] for k in packing.SPANS))):
    assert e - s == lengths[i]
    for name in ("input_tokens", "token_type_ids", "positions"):
      np.testing.assert_array_equal(packed[f"encoder_{name}"][r, s:e],
                                    batch[f"encoder_{name}"][i, :lengths[i]])
    seg = packed["encoder_segment_ids"][r]
    assert (seg[s:e] == seg[s]).all() and seg[s] > 0
    assert (seg == seg[s]).sum() == lengths[i]  # its segment id is its own
  assert not packed["encoder_segment_ids"][2].any()  # the extra row is padding


@pytest.mark.parametrize("family,pooling,kind,pairs", [
    ("encoder", "first", "classification", False),
    ("encoder", "pooler", "classification", True),
    ("encoder", "concat", "regression", False),
    ("decoder", "last", "classification", False),
    ("decoder", "mean", "classification", False),
    ("encoder_decoder", "mean", "classification", False),
])
def test_packed_rows_give_the_loss_and_gradients_of_one_example_per_row(
    family, pooling, kind, pairs):
  cfg = TransformerConfig(**BASE, **FAMILIES[family])
  model = TaskModel(cfg, kind=kind, num_labels=3, pooling=pooling, dropout_rate=0.0)
  side = input_side(family)
  lengths = [9, 3, 14, 6, 2, 11, 5, 8]
  batch = _batch(family, lengths, pairs=pairs, regression=kind == "regression")
  packed = packing.pack_batch(batch, side, 16, np.arange(len(lengths) + 1))
  assert packed[f"{side}_input_tokens"].size < batch[f"{side}_input_tokens"].size / 2
  params = jax.jit(model.init)(jax.random.key(0), batch[f"{side}_input_tokens"][:1])["params"]
  loss_fn = finetune.make_task_loss_fn(model)

  @jax.jit  # one program, not op by op (the file: 39 -> 32 s)
  def loss_and_grads(b):
    return jax.value_and_grad(lambda p: loss_fn(p, b, None)[0])(params)

  (loss, grads), (packed_loss, packed_grads) = loss_and_grads(batch), loss_and_grads(packed)
  np.testing.assert_allclose(packed_loss, loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
               packed_grads, grads)


def test_packed_rows_feed_only_sentence_heads():
  cfg = TransformerConfig(**BASE, **FAMILIES["encoder"])
  model = TaskModel(cfg, kind="token_classification", num_labels=3)
  batch = _batch("encoder", [4, 6])
  packed = packing.pack_batch(batch, "encoder", 16, np.arange(3))
  params = model.init(jax.random.key(0), batch["encoder_input_tokens"][:1])["params"]
  with pytest.raises(ValueError, match="not 'token_classification'"):
    model.apply({"params": params}, packed["encoder_input_tokens"],
                packed["encoder_segment_ids"],
                packed=tuple(packed[k] for k in packing.SPANS))


def test_the_row_table_folds_rare_row_counts_into_larger_ones():
  lengths = np.full(64, 8)
  lengths[:4] = 15  # one batch of long examples needs more rows
  batches = np.arange(64).reshape(8, 8)
  needed = packing.rows_per_batch(lengths, batches, 16)
  assert sorted(set(needed)) == [4, 6]
  cheap = packing.row_table(needed, 8, 16, 1, compile_cost=0)
  dear = packing.row_table(needed, 8, 16, 1, compile_cost=10_000)
  assert [int(cheap[k]) for k in (4, 6)] == [4, 6]  # a compile costs nothing: both
  assert [int(dear[k]) for k in (4, 6)] == [6, 6]  # dearer than 7 batches' extra rows
  assert packing.row_table(needed, 8, 16, 4, 0)[5] == 8  # rounded up to the devices


def _skewed_lengths(n=640, seed=0):
  """Short texts with a few long ones: drawn batches need from a few rows
  of 32 to many more."""
  rng = np.random.default_rng(seed)
  return np.where(rng.random(n) < 0.1, rng.integers(20, 33, n), rng.integers(2, 9, n))


def test_balanced_batches_hold_every_example_once_and_fit_fewer_rows():
  lengths, batch, row_len = _skewed_lengths(), 16, 32
  drawn = np.random.default_rng(1).permutation(len(lengths)).reshape(-1, batch)
  most = packing.rows_per_batch(lengths, drawn, row_len).max()
  rows = packing.balanced_rows(lengths, batch, row_len, 1, np.random.default_rng(0))
  assert rows < most
  order = packing.balanced_order(np.random.default_rng(1), lengths, batch, row_len, rows)
  np.testing.assert_array_equal(np.sort(order), np.arange(len(lengths)))
  assert packing.rows_per_batch(lengths, order.reshape(-1, batch), row_len).max() <= rows
  # The same generator gives the same epoch; with room for every drawn
  # batch, the permutation as drawn.
  np.testing.assert_array_equal(
      order, packing.balanced_order(np.random.default_rng(1), lengths, batch, row_len, rows))
  np.testing.assert_array_equal(
      packing.balanced_order(np.random.default_rng(1), lengths, batch, row_len, most),
      drawn.ravel())
  # Row counts stay a multiple of the devices a batch is split over.
  assert packing.balanced_rows(lengths, batch, row_len, 4, np.random.default_rng(0)) % 4 == 0


def test_a_packed_run_compiles_one_shape():
  lengths = _skewed_lengths(seed=2)
  segments = (np.arange(32) < lengths[:, None]).astype(np.int32)
  config = tasks_config.FinetuneConfig(
      train=tasks_config.FinetuneTrainConfig(epochs=3, batch_size=16, length_multiple=8))
  it, pack = train_plan.train_batches(
      {"encoder_segment_ids": segments, "encoder_input_tokens": segments,
       "labels": np.zeros(len(lengths), np.int32)}, config, "encoder", "float32", 1)
  shapes = {pack(it._batches(k))["encoder_input_tokens"].shape
            for k in range(3 * it.batches_per_epoch)}
  assert len(shapes) == 1, shapes


def test_prediction_packs_and_gives_each_example_its_own_output():
  from jaxtl.tasks import inference  # pylint: disable=g-import-not-at-top
  from jaxtl.train import sharding  # pylint: disable=g-import-not-at-top
  cfg = TransformerConfig(**BASE, **FAMILIES["encoder"])
  model = TaskModel(cfg, num_labels=3, pooling="mean", dropout_rate=0.0)
  lengths = np.random.default_rng(1).integers(2, 24, 21)  # 3 batches, one short
  arrays = _batch("encoder", lengths)
  params = model.init(jax.random.key(0), arrays["encoder_input_tokens"][:1])["params"]
  outputs = jax.jit(finetune.model_outputs(model, None, None))
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  run = lambda **kw: inference.predict(outputs, params, arrays, 8, mesh, "encoder", 8,
                                       desc=None, **kw)
  packed, plain = run(pack=True), run()
  assert packed.shape == plain.shape == (21, 3)
  np.testing.assert_allclose(packed, plain, rtol=1e-5, atol=1e-6)
