"""Tests for jaxtl.tasks.metrics: hand-computed cases, then properties."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxtl.tasks import metrics as evaluate
from jaxtl.tasks import squad as squad_lib

# A 3-class case used by several tests:
#   preds  0 1 1 2
#   labels 0 1 2 2
_P3 = [0, 1, 1, 2]
_L3 = [0, 1, 2, 2]

# A binary case: tp = 3 (items 0-2), fn = 1 (item 3), tn = 2 (items 4-5),
# fp = 1 (item 6).
_PB = [1, 1, 1, 0, 0, 0, 1]
_LB = [1, 1, 1, 1, 0, 0, 0]


# --- Classification ----------------------------------------------------------


def test_accuracy_hand_case():
  # 3 of 4 equal.
  assert evaluate.accuracy(_P3, _L3) == 0.75
  assert evaluate.accuracy(np.array([[1, 2], [3, 4]]),
                           np.array([[1, 2], [3, 4]])) == 1.0


def test_accuracy_rejects_bad_input():
  with pytest.raises(ValueError, match="shape"):
    evaluate.accuracy([1, 2], [1, 2, 3])
  with pytest.raises(ValueError, match="empty"):
    evaluate.accuracy([], [])


def test_confusion_matrix_hand_case():
  # Rows are true classes: true 2 was once predicted 1, once 2.
  m = evaluate.confusion_matrix(_P3, _L3, num_classes=4)
  np.testing.assert_array_equal(
      m, [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]])
  assert m.sum() == 4
  np.testing.assert_array_equal(m.sum(axis=1)[:3], np.bincount(_L3))
  with pytest.raises(ValueError, match=r"\[0, 2\)"):
    evaluate.confusion_matrix(_P3, _L3, num_classes=2)
  with pytest.raises(ValueError, match="integer"):
    evaluate.confusion_matrix([0.5], [0], num_classes=2)


def test_format_confusion_matrix():
  table = evaluate.format_confusion_matrix([[5, 1], [0, 12]], ["neg", "pos"])
  assert table.splitlines() == [
      "| true \\ pred | neg | pos |",
      "| ----------- | --: | --: |",
      "| neg         |   5 |   1 |",
      "| pos         |   0 |  12 |",
  ]
  with pytest.raises(ValueError, match="class names"):
    evaluate.format_confusion_matrix([[1, 2], [3, 4]], ["a", "b", "c"])


def test_macro_f1_hand_case():
  # F1_c = 2tp / (2tp + fp + fn):
  #   class 0: tp 1, fp 0, fn 0 -> 1
  #   class 1: tp 1, fp 1, fn 0 -> 2/3
  #   class 2: tp 1, fp 0, fn 1 -> 2/3
  # mean = (1 + 2/3 + 2/3) / 3 = 7/9.
  assert evaluate.macro_f1(_P3, _L3) == pytest.approx(7 / 9)
  # Classes 3 and 4 occur nowhere: skipped, not counted as 0.
  assert evaluate.macro_f1(_P3, _L3, num_classes=5) == pytest.approx(7 / 9)
  with pytest.raises(ValueError):
    evaluate.macro_f1(_P3, _L3, num_classes=2)


def test_macro_f1_counts_predicted_only_class_as_zero():
  # class 0: tp 2, fp 0, fn 1 -> 4/5; class 1: tp 0, fp 1, fn 0 -> 0.
  assert evaluate.macro_f1([0, 0, 1], [0, 0, 0]) == pytest.approx(0.4)
  # A class only in the labels (never predicted) is 0 too: class 0 is
  # 2*1/(2+0+1) = 2/3, class 1 tp 0 fp 0 fn 1 -> 0; mean 1/3.
  assert evaluate.macro_f1([0, 0], [0, 1]) == pytest.approx(1 / 3)


def test_f1_binary_hand_case():
  # Positive 1: tp 3, fp 1, fn 1 -> 6 / 8.
  assert evaluate.f1_binary(_PB, _LB) == 0.75
  # Positive 0: tp 2, fp 1 (item 3), fn 1 (item 6) -> 4 / 6.
  assert evaluate.f1_binary(_PB, _LB, positive=0) == pytest.approx(2 / 3)
  # No positive anywhere: 0/0 reported as 0.
  assert evaluate.f1_binary([0, 0], [0, 0]) == 0.0
  assert evaluate.f1_binary(_LB, _LB) == 1.0


def test_mcc_binary_hand_case():
  # (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))
  #   = (3*2 - 1*1) / sqrt(4*4*3*3) = 5/12.
  assert evaluate.matthews_corrcoef(_PB, _LB) == pytest.approx(5 / 12)


def test_mcc_multiclass_hand_case():
  # Gorodkin: s = 4, c = 3, t = (1, 1, 2), p = (1, 2, 1);
  # (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)) = (12 - 5) / sqrt(10 * 10).
  assert evaluate.matthews_corrcoef(_P3, _L3) == pytest.approx(0.7)


def test_mcc_properties():
  assert evaluate.matthews_corrcoef(_LB, _LB) == 1.0
  assert evaluate.matthews_corrcoef([1 - x for x in _LB], _LB) == -1.0
  # Constant predictions (or labels) leave it 0/0: reported as 0.
  assert evaluate.matthews_corrcoef([1] * 7, _LB) == 0.0
  assert evaluate.matthews_corrcoef(_PB, [0] * 7) == 0.0
  # Class ids need not be 0..K-1 (strings work too).
  assert evaluate.matthews_corrcoef(["b", "a"], ["b", "a"]) == 1.0


def test_mcc_equals_correlation_of_one_hot_vectors():
  # An independent route to Gorodkin's K-class MCC: the covariance of the
  # one-hot encodings, normalised.
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 4, size=200)
  preds = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 4, 200))
  x = np.eye(4)[preds] - np.eye(4)[preds].mean(0)
  y = np.eye(4)[labels] - np.eye(4)[labels].mean(0)
  expected = np.sum(x * y) / math.sqrt(np.sum(x * x) * np.sum(y * y))
  assert evaluate.matthews_corrcoef(preds, labels) == pytest.approx(expected)


# --- Regression --------------------------------------------------------------


def test_pearson_hand_case():
  # x = 1 2 3 (mean 2), y = 1 2 4 (mean 7/3): dx = -1 0 1,
  # dy = -4/3 -1/3 5/3; sum dx dy = 3, sum dx^2 = 2, sum dy^2 = 42/9;
  # r = 3 / sqrt(2 * 42/9) = 3 / sqrt(28/3).
  assert evaluate.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(
      3 / math.sqrt(28 / 3))


def test_pearson_properties():
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=50), rng.normal(size=50)
  r = evaluate.pearson(x, y)
  assert evaluate.pearson(3 * x + 7, y) == pytest.approx(r)
  assert evaluate.pearson(-x, y) == pytest.approx(-r)
  assert evaluate.pearson(x, 2 * x + 1) == pytest.approx(1.0)
  assert evaluate.pearson([0.1] * 10, x[:10]) == 0.0  # Constant: 0, no NaN.
  with pytest.raises(ValueError, match="NaN"):
    evaluate.pearson([1.0, float("nan")], [1.0, 2.0])


def test_average_ranks_ties():
  # The two 20s share ranks 2 and 3 -> 2.5 each.
  np.testing.assert_array_equal(evaluate.average_ranks([10, 20, 20, 30]),
                                [1, 2.5, 2.5, 4])
  # Three-way tie over ranks 1-3 -> 2; input order kept.
  np.testing.assert_array_equal(evaluate.average_ranks([5, 1, 1, 1]),
                                [4, 2, 2, 2])


def test_spearman_hand_cases():
  # No ties: d = 0 1 1 0, rho = 1 - 6 sum d^2 / (n (n^2 - 1)) = 1 - 12/60.
  assert evaluate.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  # Ties: ranks x = 1 2.5 2.5 4, y = 1 2 3 4; centred dx = -1.5 0 0 1.5,
  # dy = -1.5 -.5 .5 1.5; r = 4.5 / sqrt(4.5 * 5).
  assert evaluate.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(
      4.5 / math.sqrt(4.5 * 5))


def test_spearman_properties():
  rng = np.random.default_rng(2)
  x = rng.integers(0, 6, size=40).astype(float)  # Many ties.
  y = x + rng.normal(size=40)
  rho = evaluate.spearman(x, y)
  # Invariant to strictly increasing transforms of either side.
  assert evaluate.spearman(np.exp(x), y ** 3) == pytest.approx(rho)
  assert evaluate.spearman(x, y) == pytest.approx(
      evaluate.pearson(evaluate.average_ranks(x), evaluate.average_ranks(y)))
  assert evaluate.spearman(y, y) == pytest.approx(1.0)
  assert evaluate.spearman(y, -y) == pytest.approx(-1.0)


def test_pearson_spearman_match_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(3)
  x = rng.integers(0, 5, size=100).astype(float)
  y = 0.5 * x + rng.integers(0, 3, size=100)
  assert evaluate.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
  assert evaluate.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
  np.testing.assert_allclose(evaluate.average_ranks(x), stats.rankdata(x))


# --- Tagging -----------------------------------------------------------------


def test_token_accuracy_padded():
  # Labelled positions: (0,0) ok, (0,1) wrong, (0,2) ok, (1,0) ok -> 3/4;
  # the -100 positions are ignored whatever was predicted there.
  preds = np.array([[1, 2, 3], [4, 5, 0]])
  labels = np.array([[1, 0, 3], [4, -100, -100]])
  assert evaluate.token_accuracy(preds, labels) == 0.75
  assert evaluate.token_accuracy(labels, labels) == 1.0


def test_token_accuracy_ragged_lists():
  # 2 of 3 words right.
  assert evaluate.token_accuracy([[1, 2], [3]],
                                 [[1, 1], [3]]) == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="sequence 1"):
    evaluate.token_accuracy([[1, 2], [3]], [[1, 1], [3, 4, 5]])
  with pytest.raises(ValueError, match="no labelled"):
    evaluate.token_accuracy([[1]], [[-100]])


# --- SQuAD -------------------------------------------------------------------


def test_normalize_answer():
  assert evaluate.normalize_answer("The  Quick, fox!") == "quick fox"
  assert evaluate.normalize_answer("An apple a day") == "apple day"
  # Articles only as whole words; punctuation goes before article removal.
  assert evaluate.normalize_answer("Theater (the)") == "theater"
  assert evaluate.normalize_answer("  ") == ""


def test_exact_match():
  assert evaluate.exact_match("the Eiffel Tower", ["Eiffel Tower!", "x"]) == 1
  assert evaluate.exact_match("Eiffel", ["Eiffel Tower"]) == 0
  assert evaluate.exact_match("Paris", "paris.") == 1  # A bare string.
  with pytest.raises(ValueError, match="no ground-truth"):
    evaluate.exact_match("Paris", [])


def test_span_f1_hand_case():
  # pred -> "in city of paris" (4 tokens).
  #   vs "city of paris": 3 shared, P 3/4, R 1, F1 = 1.5 / 1.75 = 6/7;
  #   vs "paris": 1 shared, P 1/4, R 1, F1 = 0.4. Max: 6/7.
  assert evaluate.span_f1("in the city of Paris",
                          ["Paris", "City of Paris"]) == pytest.approx(6 / 7)
  # Shared tokens count with multiplicity: x x y vs x y y share 2 -> 2/3.
  assert evaluate.span_f1("x x y", ["x y y"]) == pytest.approx(2 / 3)
  assert evaluate.span_f1("nothing", ["else"]) == 0.0
  assert evaluate.span_f1("The", ["the"]) == 0.0  # Both empty: 0 in v1.1.


def _tiny_squad() -> dict:
  context = "Gustave Eiffel built the tower in the city of Paris."
  qas = [
      {"id": "q1", "question": "Who built it?",
       "answers": [{"text": "Gustave Eiffel", "answer_start": 0}]},
      {"id": "q2", "question": "Where?",
       "answers": [{"text": "city of Paris", "answer_start": 38},
                   {"text": "Paris", "answer_start": 46}]},
      {"id": "q3", "question": "What?",
       "answers": [{"text": "the tower", "answer_start": 21}]},
  ]
  return {"version": "1.1", "data": [
      {"title": "Eiffel", "paragraphs": [{"context": context, "qas": qas}]}]}


def test_squad_metrics_hand_case(tmp_path):
  data = _tiny_squad()
  # q1 exact (EM 1, F1 1); q2 partial (EM 0, F1 6/7); q3 unanswered (0, 0);
  # "zz" is not a question and is ignored.
  preds = {"q1": "Gustave Eiffel", "q2": "in the city of Paris", "zz": "x"}
  expected = {"exact_match": pytest.approx(100 / 3),
              "f1": pytest.approx(100 * (1 + 6 / 7) / 3)}
  assert evaluate.squad_metrics(preds, data) == expected
  assert evaluate.squad_metrics(preds, data["data"]) == expected
  # Parsed examples score the same.
  path = tmp_path / "tiny.json"
  path.write_text(json.dumps(data), encoding="utf-8")
  examples = squad_lib.read_squad_json(path)
  assert evaluate.squad_metrics(preds, examples) == expected
  gold = {e.id: e.answers[0].text for e in examples}
  assert evaluate.squad_metrics(gold, examples) == {"exact_match": 100.0,
                                                    "f1": 100.0}


# --- Per task ----------------------------------------------------------------


def test_compute_metrics():
  assert evaluate.compute_metrics("trec", _P3, _L3) == {
      "accuracy": 0.75, "macro_f1": pytest.approx(7 / 9)}
  out = evaluate.compute_metrics("mrpc", _PB, _LB)
  assert list(out) == ["f1", "accuracy"]  # Order of TASK_METRICS.
  assert out == {"f1": 0.75, "accuracy": pytest.approx(5 / 7)}
  assert evaluate.compute_metrics("cola", _PB, _LB) == {
      "mcc": pytest.approx(5 / 12)}
  scores = np.array([[0.5], [1.0], [4.0]])  # A regression head's output.
  out = evaluate.compute_metrics("stsb", scores, [1.0, 2.0, 3.0])
  assert set(out) == {"pearson", "spearman"} and out["spearman"] == 1.0
  assert evaluate.compute_metrics("pos", [[1, 2]], [[1, -100]]) == {
      "token_accuracy": 1.0}


def test_compute_metrics_errors():
  with pytest.raises(ValueError, match="unknown task"):
    evaluate.compute_metrics("mnli", [0], [0])
  with pytest.raises(ValueError, match="squad_metrics"):
    evaluate.compute_metrics("squad", [0], [0])


def test_every_task_metric_has_a_function():
  for task, names in evaluate.TASK_METRICS.items():
    assert names, task
    if task != "squad":
      for name in names:
        # pylint: disable-next=protected-access
        assert name in evaluate._METRIC_FNS, (task, name)
