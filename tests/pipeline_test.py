"""Host pipeline: determinism, resumable position, process sharding, objectives."""

import dataclasses
import os
import threading
import time

import numpy as np
import pytest

from jaxtl.data import batches, sources
from jaxtl.data.config import DataConfig
from jaxtl.pretraining import pipeline
from jaxtl.objectives import clm, span

import datadir


def _rows(n=40, length=12):
  tokens = (np.arange(n * length, dtype=np.int32).reshape(n, length) % 90) + 10
  return {"tokens": tokens, "segment_ids": np.ones_like(tokens),
          "positions": np.broadcast_to(np.arange(length, dtype=np.int32),
                                       tokens.shape).copy()}


def _noisy(row, rng):
  """An example whose content depends on the per-example rng (like masking)."""
  return {"x": row["tokens"], "noise": rng.integers(0, 1000, 3)}


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_same_seed_same_batches_and_epochs_reshuffle():
  a = _take(batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=3), 10)
  b = _take(batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=3), 10)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x["x"], y["x"])
    np.testing.assert_array_equal(x["noise"], y["noise"])
  # 40 rows / 8 = 5 batches per epoch: epoch 1 visits the same rows in another
  # order, with fresh per-example noise (dynamic masking).
  first = np.concatenate([b["x"][:, 0] for b in a[:5]])
  second = np.concatenate([b["x"][:, 0] for b in a[5:]])
  assert sorted(first) == sorted(second) and not np.array_equal(first, second)
  noise0 = {int(r): n.tolist() for b in a[:5] for r, n in zip(b["x"][:, 0], b["noise"])}
  noise1 = {int(r): n.tolist() for b in a[5:] for r, n in zip(b["x"][:, 0], b["noise"])}
  assert all(noise0[r] != noise1[r] for r in noise0)


def test_state_restores_the_exact_position():
  it = batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0)
  _take(it, 7)
  state = it.get_state()
  expected = _take(it, 4)
  fresh = batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0)
  fresh.set_state(state)
  for x, y in zip(expected, _take(fresh, 4)):
    np.testing.assert_array_equal(x["noise"], y["noise"])


def test_processes_split_the_global_batch():
  whole = _take(batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=1), 6)
  parts = [_take(batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=1,
                                        process_index=p, process_count=2), 6)
           for p in range(2)]
  for i, batch in enumerate(whole):
    for key in batch:
      np.testing.assert_array_equal(
          batch[key], np.concatenate([parts[0][i][key], parts[1][i][key]]))


def test_prefetcher_reports_the_consumers_position():
  it = batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0)
  pre = batches.Prefetcher(it, size=3)
  _take(pre, 3)
  state = pre.get_state()
  assert state == {"epoch": 0, "index": 3}
  nxt = next(pre)
  fresh = batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0)
  fresh.set_state(state)
  np.testing.assert_array_equal(next(fresh)["noise"], nxt["noise"])
  pre.close()


def test_grouped_batches_hold_rows_of_similar_length_in_random_order():
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 60, 1003)
  bs = 8
  order = batches.grouped_order(np.random.default_rng(1), lengths, bs)
  assert sorted(order) == list(range(1003))  # every row once
  full = order[:len(order) - len(order) % bs].reshape(-1, bs)
  plain = np.random.default_rng(1).permutation(1003)[:len(full) * bs].reshape(-1, bs)
  spread = lambda b: (lengths[b].max(1) - lengths[b].min(1)).mean()
  assert spread(full) < spread(plain) / 5  # little padding once cut to the longest
  # The batches are in random order, not longest first through a chunk.
  longest = lengths[full].max(1)
  assert 0.3 < np.mean(np.diff(longest[:batches.GROUP_BATCHES]) < 0) < 0.7
  # A chunk is a random sample: each batch's rows come from all over the split.
  assert np.mean(np.abs(np.diff(np.sort(full, axis=1), axis=1))) > 20


def test_grouped_iterator_is_deterministic_and_resumes_exactly():
  rows = _rows(64)
  lengths = np.random.default_rng(0).integers(1, 12, 64)
  make = lambda: batches.BatchIterator(rows, _noisy, batch_size=8, seed=2,
                                       lengths=lengths)
  it = make()
  first = _take(it, 16)  # two epochs: each its own grouping
  assert [b["x"][:, 0].tolist() for b in first[:8]] != [
      b["x"][:, 0].tolist() for b in first[8:]]
  fresh = make()
  fresh.set_state({"epoch": 1, "index": 3})
  np.testing.assert_array_equal(next(fresh)["noise"], first[11]["noise"])
  with pytest.raises(ValueError, match="63 lengths for 64 rows"):
    batches.BatchIterator(rows, _noisy, batch_size=8, seed=0, lengths=lengths[:63])


def test_eval_iteration_is_finite_and_in_order():
  it = batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0,
                              shuffle=False, repeat=False)
  made = list(it)
  assert len(made) == 5
  assert made[0]["x"][0, 0] == _rows()["tokens"][0, 0]


def test_clm_example_respects_segment_boundaries_and_padding():
  row = {"tokens": np.array([5, 6, 7, 8, 9, 0], np.int32),
         "segment_ids": np.array([1, 1, 1, 2, 2, 0], np.int32),
         "positions": np.array([0, 1, 2, 0, 1, 0], np.int32)}
  ex = clm.clm_example(row)
  np.testing.assert_array_equal(ex["decoder_input_tokens"], [5, 6, 7, 8, 9])
  np.testing.assert_array_equal(ex["decoder_target_tokens"], [6, 7, 8, 9, 0])
  # 7 -> 8 crosses into segment 2 and 9 -> pad is padding: no loss there.
  np.testing.assert_array_equal(ex["decoder_loss_weights"], [1, 1, 0, 1, 0])


def test_frame_row_adds_cls_and_sep():
  row = {k: v[0] for k, v in _rows(4, 5).items()}
  framed = pipeline.frame_row(row, 101, 102)
  assert framed["tokens"].shape == (7,)
  assert framed["tokens"][0] == 101 and framed["tokens"][-1] == 102
  np.testing.assert_array_equal(framed["positions"], np.arange(7))


def test_span_batch_shapes_and_shift_with_the_t5_vocabulary():
  from jaxtl.objectives import corruption
  from jaxtl.data.tokenizer_files import get_tokenizer
  tok = get_tokenizer(datadir.require_data("tokenizers", "t5_c4_32k_100extra.spm.model"))
  raw, targets_len = corruption.span_corruption_lengths(64)
  rows = {"tokens": np.arange(100, 100 + raw, dtype=np.int32)[None]}
  sentinels = np.array([tok.sentinel_id(i) for i in range(100)], np.int32)
  batch = span.span_batch(rows, [np.random.default_rng(0)], tok,
                          span.SpanConfig(name="span"),
                          sentinels, 64, targets_len)
  ex = {k: v[0] for k, v in batch.items()}
  assert ex["encoder_input_tokens"].shape == (64,)
  assert (ex["encoder_segment_ids"] == 1).all()  # full rows: no padding
  assert ex["decoder_target_tokens"].shape == (targets_len,)
  np.testing.assert_array_equal(ex["decoder_input_tokens"][1:],
                                ex["decoder_target_tokens"][:-1])
  assert ex["decoder_input_tokens"][0] == tok.pad_id
  assert ex["decoder_target_tokens"][0] == tok.sentinel_id(0)
  n = int(ex["decoder_loss_weights"].sum())
  assert ex["decoder_target_tokens"][n - 1] == tok.eos_id


def test_too_small_split_is_a_clear_error():
  with pytest.raises(ValueError, match="fewer than one batch"):
    batches.BatchIterator(_rows(4), _noisy, batch_size=8, seed=0)


def test_pack_mode_keeps_documents_apart(tmp_path):
  from jaxtl.data.tokenizer_files import get_tokenizer
  tok = get_tokenizer(datadir.require_data("tokenizers", "t5_c4_32k_100extra.spm.model"))
  texts = ["A short one.", "Another document, a bit longer than the first.",
           "Third."] * 4
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
  data = DataConfig(source=sources.source_config(
      {"kind": "text", "files": {"train": str(corpus)}}), packing="pack")
  store = pipeline.split_rows(data, "train", tok, 32, eos=True,
                              cache_dir=str(tmp_path / "cache"))
  rows = {k: np.stack([r[k] for r in store.take(range(len(store)))])
          for k in ("tokens", "segment_ids", "positions")}
  docs = [tok.encode(t) + [tok.eos_id] for t in texts]
  got = []
  for toks, seg in zip(rows["tokens"], rows["segment_ids"]):
    for s in range(1, seg.max() + 1):
      got.append(toks[seg == s].tolist())
  assert got == docs
  assert (rows["positions"][rows["segment_ids"] > 0] < 32).all()
  for r in store.take(range(len(store))):  # positions restart per document
    for s in range(1, r["segment_ids"].max() + 1):
      np.testing.assert_array_equal(r["positions"][r["segment_ids"] == s],
                                    np.arange((r["segment_ids"] == s).sum()))
  chunked = pipeline.split_rows(dataclasses.replace(data, packing="chunk"), "train", tok, 32,
                                eos=True, cache_dir=str(tmp_path / "cache"))
  assert chunked.meta["documents"] == len(texts)
  tokens = chunked.tokens_array()
  assert all((r["segment_ids"] == 1).all() for r in chunked.take([0, 1]))
  assert tokens.ravel().tolist() == sum(docs, [])[:tokens.size]


def test_unreadable_data_leaves_no_tokenizer_folder(tmp_path):
  """A run whose data cannot be read fails before writing tokenizer/: an
  empty one would be taken for a trained tokenizer's folder next time. A
  missing file (here the validation split's, read last) fails before the
  run writes anything. (TFDS's offline error itself: sources_test.)"""
  from jaxtl.configs import pretrain_clm  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain_clm.get_config()
  bad, missing = tmp_path / "bad.jsonl", str(tmp_path / "missing.jsonl")
  bad.write_text('{"text": "fine"}\n{"text": \n')
  config.data.source.update(kind="jsonl", name="", manual_dir="")
  config.data.source.files = dict(train=(str(bad),), validation=(missing,))
  with pytest.raises(FileNotFoundError, match="missing.jsonl"):
    pretrain.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()
  config.data.source.files.validation = (str(bad),)
  with pytest.raises(ValueError, match="bad.jsonl"):
    pretrain.train_and_evaluate(config, str(tmp_path / "wd"))
  assert [p.name for p in (tmp_path / "wd").iterdir()] == []


def _store(tmp_path, n=40, length=12, eos_id=None):
  from jaxtl.data import row_store  # pylint: disable=g-import-not-at-top
  docs = list(_rows(n, length)["tokens"])
  path = str(tmp_path / "rows")
  row_store.build(path, iter(docs), row_store.Layout("chunk", length, eos_id, 0),
                  vocab_size=100, name="test rows")
  return row_store.RowStore(path)


def test_rows_on_disk_give_the_batches_of_rows_in_memory(tmp_path):
  store = _store(tmp_path)
  assert len(store) == 40 and store.meta["tokens"] == 40 * 12
  on_disk = _take(batches.BatchIterator(store, _noisy, batch_size=8, seed=3), 7)
  in_memory = _take(batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=3), 7)
  for a, b in zip(on_disk, in_memory):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.multiprocess
def test_grain_workers_make_the_same_batches_and_resume_exactly(tmp_path):
  store = _store(tmp_path)
  alone = _take(batches.BatchIterator(store, _noisy, batch_size=8, seed=5), 9)
  it = batches.BatchIterator(store, _noisy, batch_size=8, seed=5, workers=2)
  first = _take(it, 4)
  state = it.get_state()  # the consumer's position, whatever the workers made
  it.close()
  again = batches.BatchIterator(store, _noisy, batch_size=8, seed=5, workers=1)
  again.set_state(state)
  rest = _take(again, 5)
  again.close()
  for a, b in zip(alone, first + rest):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("packing", ["chunk", "pack"])
def test_rows_number_the_documents_they_start_in(packing, tmp_path):
  """One number per document, whichever rows it spans (NSP tells a random
  row's documents from its own by them); a store built without the index
  makes the same one when asked."""
  from jaxtl.data import row_store  # pylint: disable=g-import-not-at-top
  from jaxtl.objectives import sentence_pairs  # pylint: disable=g-import-not-at-top
  lengths = [3, 15, 2, 9, 30, 4, 7]  # doc k holds 100 * (k + 1) + i
  docs = [np.arange(100 * (k + 1), 100 * (k + 1) + n, dtype=np.int32)
          for k, n in enumerate(lengths)]
  path = str(tmp_path / "rows")
  row_store.build(path, iter(docs), row_store.Layout(packing, 12, 1, 0),
                  vocab_size=4000, name="test rows")
  store = row_store.RowStore(path)
  firsts = np.array(store.first_documents())
  owner = {}  # document number -> the documents its tokens come from
  for i, row in enumerate(store.take(range(len(store)))):
    numbered = sentence_pairs.row_documents({**row, "document": firsts[i]}, 1)
    for number, tokens in numbered.items():
      source = set((tokens // 100 - 1).tolist())
      assert len(source) == 1 and owner.setdefault(number, source) == source
  assert len({min(s) for s in owner.values()}) == len(owner) > 1
  os.remove(path + row_store.DOCS_SUFFIX)
  np.testing.assert_array_equal(row_store.RowStore(path).first_documents(), firsts)
  (tmp_path / "no_eos").mkdir()
  with pytest.raises(ValueError, match="without EOS"):
    _store(tmp_path / "no_eos").first_documents()


@pytest.mark.parametrize("name", ["mlm", "span", "mlm_nsp"])
def test_batches_made_at_once_are_their_examples_made_one_by_one(name, tmp_path):
  """An objective's make_batch (the pipeline's path) gives the examples its
  make_example gives row by row, framing included: what a row becomes does
  not depend on which form, or which batch, made it."""
  from types import SimpleNamespace  # pylint: disable=g-import-not-at-top
  from jaxtl import objectives  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import common  # pylint: disable=g-import-not-at-top
  tok = SimpleNamespace(mask_id=3, vocab_size=100, special_ids=np.array([0, 1, 2, 3]),
                        cls_id=1, sep_id=2, eos_id=2, pad_id=0, num_sentinels=20,
                        sentinel_id=lambda i: 99 - i)
  prepared = objectives.get(name).prepare(
      tok, common.objective_config(name=name, mask_rate=0.3),
      common.data_config(seq_len=24))
  make_example, make_batch = prepared.make_example, prepared.make_batch
  if prepared.framed:
    framed = pipeline.Framed(make_example, tok.cls_id, tok.sep_id, make_batch)
    make_example, make_batch = framed, framed.batch
  store = _store(tmp_path, length=prepared.row_length,
                 eos_id=tok.eos_id if prepared.eos else None)
  kw = dict(batch_size=8, seed=2, partners=prepared.partner)
  one_by_one = batches.BatchIterator(store, make_example, **kw)
  at_once = batches.BatchIterator(store, make_example, make_batch=make_batch, **kw)
  for a, b in zip(_take(one_by_one, 6), _take(at_once, 6)):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
      assert a[k].dtype == b[k].dtype
  assert b["encoder_input_tokens"].shape[1] == 24


def test_segment_positions_of_stacked_rows_are_each_rows():
  from jaxtl.data import row_store  # pylint: disable=g-import-not-at-top
  segments = np.array([[1, 1, 2, 2, 2, 0], [1, 2, 3, 3, 0, 0], [1, 1, 1, 1, 1, 1]])
  expected = [[0, 1, 0, 1, 2, 0], [0, 0, 0, 1, 0, 0], [0, 1, 2, 3, 4, 5]]
  np.testing.assert_array_equal(row_store.segment_positions(segments), expected)
  for row, want in zip(segments, expected):
    np.testing.assert_array_equal(row_store.segment_positions(row), want)


def test_peek_leaves_the_batch_for_next_and_says_none_at_the_end_or_on_errors():
  it = batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0)
  expected = _take(batches.BatchIterator(_rows(), _noisy, batch_size=8, seed=0), 2)
  pre = batches.Prefetcher(it, size=1)
  np.testing.assert_array_equal(pre.peek()["noise"], expected[0]["noise"])
  np.testing.assert_array_equal(pre.peek()["noise"], expected[0]["noise"])
  assert pre.get_state() == {"epoch": 0, "index": 0}  # the consumer has taken none
  np.testing.assert_array_equal(next(pre)["noise"], expected[0]["noise"])
  np.testing.assert_array_equal(next(pre)["noise"], expected[1]["noise"])
  pre.close()

  def broken():
    yield {"x": np.zeros(2)}
    raise ValueError("line 7 of rows.txt: not a number")

  class Plain:  # an iterator as the loop needs one: next and get_state
    def __init__(self, gen):
      self.gen = gen

    def __next__(self):
      return next(self.gen)

    def get_state(self):
      return {}

  pre = batches.Prefetcher(Plain(broken()), size=1)
  assert next(pre)["x"].shape == (2,)
  assert pre.peek() is None
  with pytest.raises(ValueError, match="line 7 of rows.txt"):
    next(pre)  # the error is next's to raise, as without peek
  pre = batches.Prefetcher(Plain(iter([])), size=1)
  assert pre.peek() is None
  with pytest.raises(StopIteration):
    next(pre)


def test_closing_wakes_a_peek_that_waits_for_a_batch():
  class Slow:
    def __next__(self):
      time.sleep(0.2)
      return {"x": np.zeros(2)}

    def get_state(self):
      return {}

  pre = batches.Prefetcher(Slow(), size=1)
  pre.close()
  waiter = threading.Thread(target=pre.peek, daemon=True)
  waiter.start()
  waiter.join(timeout=5)
  assert not waiter.is_alive()
