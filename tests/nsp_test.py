"""NSP and SOP: sentence pairs drawn from a row's documents (rates, labels,
token types, where B comes from), and their loss on BERT's sentence head."""

import importlib
import os

import jax
import ml_collections
import numpy as np
import pytest

from jaxtl.pretraining import pretrain
from jaxtl import objectives
from jaxtl.data import packing
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig, build_model
from jaxtl.objectives import sentence_pairs as sp

PAD, EOS, UNK, MASK, CLS, SEP = 0, 1, 2, 3, 4, 5


class FakeTokenizer(Tokenizer):
  """Ids only: the objective never encodes text."""
  vocab_size, pad_id, eos_id, unk_id = 1000, PAD, EOS, UNK
  mask_id, cls_id, sep_id = MASK, CLS, SEP

  def encode(self, text):
    raise NotImplementedError

  def decode(self, ids):
    raise NotImplementedError

  def fingerprint(self):
    return "fake"


# Document k holds the ids 100 * (k + 1) + i: where a token came from, and
# whether two pieces follow each other, can be read off the ids.
def document(k, n):
  return np.arange(100 * (k + 1), 100 * (k + 1) + n, dtype=np.int32)


def doc_of(tokens):
  return set((np.asarray(tokens) // 100).tolist())


def contiguous(x):
  return bool(np.all(np.diff(x) == 1))


def prepared(task, seq_len=24):
  objective = ml_collections.ConfigDict(dict(
      name=f"mlm_{task}", mask_rate=0.15, mask_token_rate=0.8, random_token_rate=0.1))
  data = ml_collections.ConfigDict(dict(seq_len=seq_len, packing="chunk",
                                        tokenizer=dict(path="")))
  return objectives.get(f"mlm_{task}").prepare(FakeTokenizer(), objective, data)


def chunk_row(docs, length):
  """A ``chunk`` row: documents ended by EOS, one stream, cut to length."""
  return {"tokens": packing.chunk_stream(docs, length, eos_id=EOS)[0],
          "segment_ids": np.ones(length, np.int32),
          "positions": np.arange(length, dtype=np.int32)}


def test_documents_of_chunked_and_packed_rows():
  docs = [document(0, 3), document(1, 2), document(2, 9)]
  found = sp.row_documents(chunk_row(docs, 10), EOS)
  assert {k: d.tolist() for k, d in found.items()} == {
      0: [100, 101, 102], 1: [200, 201], 2: [300, 301, 302]}
  packed = packing.pack_sequences([{"tokens": np.append(d, EOS)} for d in docs[:2]],
                                  {"tokens": 10})
  row = {"tokens": packed["tokens"][0], "segment_ids": packed["tokens_segment_ids"][0]}
  assert [d.tolist() for d in sp.row_documents(row, EOS).values()] == [
      [100, 101, 102], [200, 201]]


@pytest.mark.parametrize("task", sp.TASKS)
def test_half_the_pairs_are_in_order_and_labels_say_which(task):
  docs = dict(enumerate([document(0, 30), document(1, 7), document(2, 12)]))
  rng = np.random.default_rng(0)
  labels = []
  for _ in range(4000):
    a, b, label = sp.sentence_pair(docs, 20, task, rng)
    assert 1 <= a.size and 1 <= b.size and a.size + b.size <= 20
    labels.append(label)
    if label == sp.IN_ORDER:  # B is what follows A in its document
      assert contiguous(np.concatenate([a, b])) and len(doc_of([*a, *b])) == 1
    elif task == "sop":  # the same two segments, swapped
      assert contiguous(np.concatenate([b, a])) and len(doc_of([*a, *b])) == 1
    else:  # NSP's random next: a segment of another document
      assert doc_of(a) != doc_of(b) and contiguous(a) and contiguous(b)
  assert abs(np.mean(labels) - 0.5) < 0.03  # 4000 draws: sd 0.008


def test_nsp_with_one_document_takes_a_segment_that_does_not_touch_a():
  doc = document(0, 60)
  rng = np.random.default_rng(1)
  for _ in range(500):
    a, b, label = sp.sentence_pair({0: doc}, 20, "nsp", rng)
    if label == sp.NOT_IN_ORDER:
      assert not set(a.tolist()) & set(b.tolist())
      assert b[0] != a[-1] + 1  # not A's continuation


@pytest.mark.parametrize("task", sp.TASKS)
def test_examples_are_framed_with_token_types_and_masked(task):
  seq_len = 24
  prep = prepared(task, seq_len)
  assert prep.lengths == {"encoder": seq_len} and prep.eos
  assert prep.row_length == sp.PAIR_WINDOW * (seq_len - 3)
  docs = [document(k, n) for k, n in enumerate((9, 25, 4, 30))]
  row = chunk_row(docs, prep.row_length)
  for seed in range(50):
    ex = prep.make_example(row, np.random.default_rng(seed))
    tokens, types = ex["encoder_target_tokens"], ex["encoder_token_type_ids"]
    real = ex["encoder_segment_ids"] > 0
    n = int(real.sum())
    assert real[:n].all() and not real[n:].any()
    seps = np.flatnonzero(tokens[:n] == SEP)
    assert tokens[0] == CLS and len(seps) == 2 and seps[1] == n - 1
    np.testing.assert_array_equal(types[:seps[0] + 1], 0)
    np.testing.assert_array_equal(types[seps[0] + 1:n], 1)
    np.testing.assert_array_equal(types[n:], 0)
    np.testing.assert_array_equal(ex["encoder_positions"][:n], np.arange(n))
    # MLM: only real, non-special tokens carry loss.
    chosen = ex["encoder_loss_weights"] > 0
    assert chosen.any() and not np.isin(tokens[chosen], [CLS, SEP, PAD]).any()
    a, b = tokens[1:seps[0]], tokens[seps[0] + 1:n - 1]
    label = int(ex["sentence_labels"])
    assert label in (0, 1)
    first, second = (a, b) if label == 0 or task == "nsp" else (b, a)
    if label == 0 or task == "sop":
      assert contiguous(np.concatenate([first, second]))


def test_same_row_and_seed_give_the_same_example():
  prep = prepared("nsp")
  row = chunk_row([document(0, 20), document(1, 30)], prep.row_length)
  one, two = (prep.make_example(row, np.random.default_rng(7)) for _ in range(2))
  for k in one:
    np.testing.assert_array_equal(one[k], two[k])


def _model_and_batch(sentence_classes=2, batch=4, length=12, init=jax.jit):
  cfg = TransformerConfig(family="encoder", vocab_size=1000, d_model=16, num_heads=2,
                          head_dim=8, mlp_dim=32, num_layers=1, max_len=32,
                          type_vocab_size=2, sentence_classes=sentence_classes,
                          pre_norm=False, embed_norm=True, dropout_rate=0.0)
  prep = prepared("nsp", length)
  rows = [chunk_row([document(k, 9), document(k + 1, 15)], prep.row_length)
          for k in range(batch)]
  examples = [prep.make_example(r, np.random.default_rng(i)) for i, r in enumerate(rows)]
  b = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
  model = build_model(cfg)
  params = init(model.init)(jax.random.key(0), b["encoder_input_tokens"])["params"]
  return model, params, b


@pytest.mark.slow
def test_loss_is_mlm_plus_the_mean_sentence_cross_entropy():
  model, params, b = _model_and_batch()
  loss, sums = jax.jit(objectives.make_loss_fn(model))(params, b, None)
  forward = jax.jit(lambda p, b: objectives.forward(model, p, b))
  out = forward(params, b)
  logp = jax.nn.log_softmax(out["sentence_logits"])
  nsp = -np.mean(np.take_along_axis(np.asarray(logp), b["sentence_labels"][:, None], 1))
  mlm = sums["loss_sum"] / sums["weight_sum"]
  np.testing.assert_allclose(loss, mlm + nsp, rtol=1e-5)
  summary = objectives.get("mlm_nsp").summarize(jax.device_get(sums))
  np.testing.assert_allclose(summary["sentence_loss"], nsp, rtol=1e-5)
  assert 0 <= summary["sentence_accuracy"] <= 1
  # The sentence head reads [CLS] after token types: B's types change it.
  flipped = dict(b, encoder_token_type_ids=1 - b["encoder_token_type_ids"])
  assert not np.allclose(forward(params, flipped)["sentence_logits"],
                         out["sentence_logits"])


def test_a_run_whose_model_lacks_the_sentence_head_fails_before_any_work(tmp_path):
  config = importlib.import_module("jaxtl.configs.pretrain_mlm").get_config(
      "objective=mlm_sop")
  config.model.sentence_classes = 0
  with pytest.raises(ValueError, match=r"mlm_sop' needs config.model.sentence_classes"):
    pretrain.train_and_evaluate(config, str(tmp_path))
  assert not os.listdir(tmp_path)


def test_a_model_without_the_sentence_head_fails_naming_the_key():
  with pytest.raises(ValueError, match=r"config.model.sentence_classes >= 2"):
    objectives.check_model("mlm_nsp", TransformerConfig(type_vocab_size=2))
  with pytest.raises(ValueError, match=r"config.model.type_vocab_size >= 2"):
    objectives.check_model("mlm_sop", TransformerConfig(sentence_classes=2))
  model, params, b = _model_and_batch(sentence_classes=0,
                                      init=lambda f: lambda *a: jax.eval_shape(f, *a))
  with pytest.raises(ValueError, match="sentence_classes=2"):
    jax.eval_shape(objectives.make_loss_fn(model), params, b, None)


def _corpus_pairs(tmp_path, lengths, partners=True, batches=40, **kw):
  """``(A, B, label)`` of the NSP examples the pipeline makes from a corpus
  whose document k has ``lengths[k]`` tokens (rows on disk, as in a run)."""
  from jaxtl.pretraining import pipeline  # pylint: disable=g-import-not-at-top
  from jaxtl.data import row_store
  prep = prepared("nsp")
  path = str(tmp_path / "rows")
  if not row_store.RowStore.exists(path):
    layout = row_store.Layout("chunk", prep.row_length, EOS, PAD)
    row_store.build(path, (document(k, n) for k, n in enumerate(lengths)), layout,
                    10_000, "corpus")
  it = pipeline.BatchIterator(row_store.RowStore(path), prep.make_example, batch_size=8,
                              seed=0, partners=partners and prep.partner, **kw)
  pairs = []
  for _ in range(batches):
    batch = next(it)
    for tokens, label in zip(batch["encoder_target_tokens"], batch["sentence_labels"]):
      seps = np.flatnonzero(tokens == SEP)
      pairs.append((tokens[1:seps[0]], tokens[seps[0] + 1:seps[1]], int(label)))
  return pairs


def test_nsp_takes_the_random_next_from_another_document_of_the_corpus(tmp_path):
  # 40 documents, most longer than a row (42 tokens): a row often holds one.
  lengths = np.random.default_rng(0).integers(20, 99, 40)
  pairs = _corpus_pairs(tmp_path, lengths)
  labels = np.array([label for _, _, label in pairs])
  assert abs(labels.mean() - 0.5) < 0.1  # 320 pairs: sd 0.028
  negatives = [(a, b) for a, b, label in pairs if label == sp.NOT_IN_ORDER]
  for a, b in negatives:
    assert contiguous(a) and contiguous(b) and len(doc_of(a)) == len(doc_of(b)) == 1
  same = np.mean([doc_of(a) == doc_of(b) for a, b in negatives])
  assert same < 0.03, same
  # The window alone (no partner row) often has only A's document.
  alone = [doc_of(a) == doc_of(b) for a, b, label in _corpus_pairs(
      tmp_path, lengths, partners=False) if label == sp.NOT_IN_ORDER]
  assert np.mean(alone) > 0.2
  # Partners are drawn per example: two processes make the same pairs.
  halves = [_corpus_pairs(tmp_path, lengths, batches=5, process_index=p,
                          process_count=2) for p in range(2)]
  split = [p for k in range(5) for half in halves for p in half[4 * k:4 * k + 4]]
  for (a, b, la), (c, d, lc) in zip(pairs[:40], split, strict=True):
    assert la == lc and np.array_equal(a, c) and np.array_equal(b, d)


def test_nsp_on_a_corpus_of_one_document_takes_b_from_it_away_from_a(tmp_path):
  pairs = _corpus_pairs(tmp_path, [800], batches=20)  # ids 100..899
  assert abs(np.mean([label for _, _, label in pairs]) - 0.5) < 0.12  # 160 pairs
  for a, b, label in pairs:
    assert contiguous(a) and contiguous(b)
    if label == sp.NOT_IN_ORDER:
      assert not set(a.tolist()) & set(b.tolist()) and b[0] != a[-1] + 1
