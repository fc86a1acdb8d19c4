"""Span QA features: windows, answer labels, and predictions back to text."""

import numpy as np
import pytest

from jaxtl.tasks import span_features, readers as tasks
from jaxtl.tasks.squad import Answer, SquadExample
from jaxtl.data.sentencepiece_training import train_sentencepiece

import datadir


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  text = datadir.require_data("tiny_shakespeare", "input.txt").read_text()
  lines = [l for l in text.splitlines() if l.strip()][:3000]
  return train_sentencepiece(lines, tmp_path_factory.mktemp("tok") / "sp", 600)


def _example(context, answer, qid="q1"):
  return SquadExample(id=qid, title="t", context=context, question="Who is it?",
                      answers=(Answer(answer, context.index(answer)),))


def _labelled_text(feats, ex, row):
  start, end = feats.arrays["labels"][row]
  return ex.context[feats.offsets[row, start, 0]:feats.offsets[row, end, 1]]


def test_labels_point_at_the_answer_and_windows_overlap(tok):
  context = " ".join(f"word{i}" for i in range(60)) + " the king of Denmark is here."
  ex = _example(context, "king of Denmark")
  f = span_features.encode_spans([ex], tok, 48, "encoder", doc_stride=16)
  n = len(f)
  assert n > 2 and f.truncated == 1 and (f.example_index == 0).all()
  held = f.arrays["label_weights"][:, 0] > 0
  assert held.any() and not held.all()  # only windows holding the answer count
  for row in np.flatnonzero(held):
    assert _labelled_text(f, ex, row) == "king of Denmark"
  tokens = f.arrays["encoder_input_tokens"]
  assert (tokens[:, 0] == tok.cls_id).all()
  ctx = f.arrays["context_mask"] > 0
  assert (f.arrays["encoder_token_type_ids"][ctx] == 1).all()
  assert ((f.offsets[..., 0] >= 0) == ctx).all()


def test_span_texts_takes_the_best_window(tok):
  ex = _example("Alas, poor Yorick! I knew him, Horatio.", "Horatio")
  f = span_features.encode_spans([ex, _example(ex.context, "Yorick", "q2")], tok,
                                 64, "decoder")
  assert (f.arrays["decoder_input_tokens"][:, 0] != tok.cls_id).all()
  assert len(f) == 2 and f.truncated == 0
  (s1, e1), (s2, e2) = f.arrays["labels"]
  spans = np.array([[s1, e1, 5.0], [s2, e2, 1.0]])
  examples = [ex, _example(ex.context, "Yorick", "q2")]
  assert span_features.span_texts(examples, f, spans) == {"q1": "Horatio", "q2": "Yorick"}
  # Two windows of one question: the higher score wins.
  f.example_index[:] = 0
  assert span_features.span_texts(examples, f, spans) == {"q1": "Horatio"}
  spans[1, 2] = 9.0
  assert span_features.span_texts(examples, f, spans) == {"q1": "Yorick"}


def test_every_real_squad_answer_is_recovered_from_its_labels(tok):
  examples = tasks.load_task("squad", "eval")[:300]
  f = span_features.encode_spans(examples, tok, 128, "encoder", doc_stride=64)
  recovered = {}
  for row in np.flatnonzero(f.arrays["label_weights"][:, 0] > 0):
    ex = examples[f.example_index[row]]
    recovered[ex.id] = _labelled_text(f, ex, row)
  assert len(recovered) == len(examples)
  same = sum(recovered[e.id] == e.answers[0].text for e in examples)
  assert same >= 0.98 * len(examples)  # the rest differ by sub-word edges
