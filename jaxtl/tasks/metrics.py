"""Evaluation metrics for the adaptation tasks, in plain numpy.

Metrics run on the host after predictions leave the accelerator, so they are
small pure functions of numpy arrays (or lists) with no JAX in sight; that
keeps them easy to test against hand-computed cases and usable from any
evaluation script. Classification inputs are class ids (argmax the logits
first), not scores. Fractions are returned in [0, 1], except `squad_metrics`,
which reports percentages as the official SQuAD script does.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ArrayLike = Any  # np.ndarray, a list, or anything np.asarray accepts.


def _pair(preds: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
  """Flattens two equally shaped, non-empty inputs to 1-D arrays."""
  p, l = np.asarray(preds), np.asarray(labels)
  if p.shape != l.shape:
    raise ValueError(f"preds and labels differ in shape: {p.shape} vs "
                     f"{l.shape}")
  if p.size == 0:
    raise ValueError("cannot score an empty set of predictions")
  return p.ravel(), l.ravel()


# --- Classification ----------------------------------------------------------


def accuracy(preds: ArrayLike, labels: ArrayLike) -> float:
  """Fraction of predictions equal to their label: mean(pred_i == label_i)."""
  p, l = _pair(preds, labels)
  return float(np.mean(p == l))


def confusion_matrix(preds: ArrayLike, labels: ArrayLike,
                     num_classes: int) -> np.ndarray:
  """Counts of (true class, predicted class) pairs.

  Args:
    preds: Predicted class ids in [0, num_classes).
    labels: True class ids in [0, num_classes).
    num_classes: Size of the label set; fixes the matrix shape so that
      matrices from different runs line up even when a class never occurs.

  Returns:
    An int64 [num_classes, num_classes] matrix M with M[t, p] the number of
    examples of true class t predicted as p; rows sum to the class counts.
  """
  p, l = _pair(preds, labels)
  for name, ids in (("preds", p), ("labels", l)):
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"{name} must be integer class ids, got {ids.dtype}")
    if ids.min() < 0 or ids.max() >= num_classes:
      raise ValueError(f"{name} must lie in [0, {num_classes}), got values "
                       f"in [{ids.min()}, {ids.max()}]")
  flat = np.bincount(l.astype(np.int64) * num_classes + p,
                     minlength=num_classes * num_classes)
  return flat.reshape(num_classes, num_classes)


def format_confusion_matrix(matrix: ArrayLike,
                            class_names: Sequence[str]) -> str:
  """Renders a confusion matrix as a markdown table for logs and reports.

  Rows are true classes and columns predicted classes, matching
  `confusion_matrix`; columns are padded so the table also reads as text.
  """
  m = np.asarray(matrix)
  k = len(class_names)
  if m.shape != (k, k):
    raise ValueError(f"matrix of shape {m.shape} does not fit {k} class names")
  corner = "true \\ pred"
  header = [corner] + [str(n) for n in class_names]
  rows = [[str(n)] + [str(v) for v in row] for n, row in zip(class_names, m)]
  widths = [max(len(r[j]) for r in [header] + rows) for j in range(k + 1)]

  def line(cells: Sequence[str]) -> str:
    first = cells[0].ljust(widths[0])
    rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
    return "| " + " | ".join([first] + rest) + " |"

  rule = "| " + " | ".join(
      ["-" * widths[0]] + ["-" * (w - 1) + ":" for w in widths[1:]]) + " |"
  return "\n".join([line(header), rule] + [line(r) for r in rows])


def macro_f1(preds: ArrayLike, labels: ArrayLike,
             num_classes: int | None = None) -> float:
  """Unweighted mean over classes of the per-class F1 score.

  Per class c, with true positives tp, false positives fp and false
  negatives fn, F1_c = 2 tp / (2 tp + fp + fn), which equals the harmonic
  mean of precision and recall and is 0 when both are 0. A class that
  appears in neither preds nor labels has no F1 (0/0) and is left out of the
  mean instead of counting as 0 or 1, so a small evaluation set missing a
  rare class is not penalised for it.

  Args:
    preds: Predicted classes.
    labels: True classes.
    num_classes: If given, ids must lie in [0, num_classes); it only checks
      the range, since absent classes are skipped either way.

  Returns:
    The macro-averaged F1.
  """
  p, l = _pair(preds, labels)
  if num_classes is not None:
    for name, ids in (("preds", p), ("labels", l)):
      if ids.min() < 0 or ids.max() >= num_classes:
        raise ValueError(f"{name} must lie in [0, {num_classes})")
  scores = []
  for c in np.union1d(p, l):  # Only classes present somewhere.
    tp = np.sum((p == c) & (l == c))
    fp = np.sum((p == c) & (l != c))
    fn = np.sum((p != c) & (l == c))
    scores.append(2 * tp / (2 * tp + fp + fn))
  return float(np.mean(scores))


def f1_binary(preds: ArrayLike, labels: ArrayLike, positive: Any = 1) -> float:
  """F1 of the positive class, 2 tp / (2 tp + fp + fn) (MRPC's F1).

  Returns 0 when there is neither a positive prediction nor a positive
  label, where the score is 0/0.
  """
  p, l = _pair(preds, labels)
  tp = np.sum((p == positive) & (l == positive))
  fp = np.sum((p == positive) & (l != positive))
  fn = np.sum((p != positive) & (l == positive))
  denominator = 2 * tp + fp + fn
  return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(preds: ArrayLike, labels: ArrayLike) -> float:
  """Matthews correlation coefficient (CoLA's metric), for any class count.

  Uses Gorodkin's (2004) generalisation of the binary MCC to K classes: with
  the confusion matrix C over the classes present, s = total count,
  c = trace(C) (correct predictions), t_k = true count and p_k = predicted
  count of class k,

    MCC = (c s - sum_k t_k p_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k t_k^2)),

  which for two classes equals (tp tn - fp fn) / sqrt((tp + fp)(tp + fn)
  (tn + fp)(tn + fn)). It is 0 when undefined (a factor of the denominator
  is 0, as when all predictions or all labels are one class), the
  convention GLUE inherits from scikit-learn.
  """
  p, l = _pair(preds, labels)
  classes, ids = np.unique(np.concatenate([l, p]), return_inverse=True)
  k = len(classes)
  true_ids, pred_ids = ids[:len(l)], ids[len(l):]
  counts = np.bincount(true_ids * k + pred_ids, minlength=k * k)
  cm = counts.reshape(k, k).astype(np.float64)
  s = cm.sum()
  t = cm.sum(axis=1)
  pk = cm.sum(axis=0)
  numerator = np.trace(cm) * s - t @ pk
  denominator = np.sqrt((s * s - pk @ pk) * (s * s - t @ t))
  if denominator == 0:
    return 0.0
  return float(numerator / denominator)


# --- Regression --------------------------------------------------------------


def _float_pair(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
  a, b = _pair(x, y)
  a, b = a.astype(np.float64), b.astype(np.float64)
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    raise ValueError("inputs contain NaN or infinite values")
  return a, b


def pearson(x: ArrayLike, y: ArrayLike) -> float:
  """Pearson's linear correlation r (STS-B).

  r = sum((x - mean x)(y - mean y)) / sqrt(sum((x - mean x)^2)
  sum((y - mean y)^2)). A constant input leaves r undefined (0/0); we return
  0 ("no linear relation"), like `matthews_corrcoef`, so that a collapsed
  regression head logs a number rather than NaN.
  """
  a, b = _float_pair(x, y)
  if np.all(a == a[0]) or np.all(b == b[0]):
    return 0.0
  da, db = a - a.mean(), b - b.mean()
  r = (da @ db) / np.sqrt((da @ da) * (db @ db))
  return float(np.clip(r, -1.0, 1.0))  # Rounding can step just past 1.


def average_ranks(x: ArrayLike) -> np.ndarray:
  """1-based ranks of a 1-D input, ties sharing the mean of their ranks.

  E.g. [10, 20, 20, 30] -> [1, 2.5, 2.5, 4]: the two 20s would take ranks 2
  and 3, so each gets 2.5.
  """
  a = np.asarray(x).ravel()
  order = np.argsort(a, kind="stable")
  sorted_a = a[order]
  # Start index (in sorted order) of each run of equal values, and its end.
  starts = np.flatnonzero(np.r_[True, sorted_a[1:] != sorted_a[:-1]])
  ends = np.r_[starts[1:], len(a)]
  # Positions start..end-1 hold 1-based ranks start+1..end; their mean:
  mean_rank = (starts + 1 + ends) / 2.0
  ranks = np.empty(len(a), dtype=np.float64)
  ranks[order] = np.repeat(mean_rank, ends - starts)
  return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
  """Spearman's rank correlation rho (STS-B): Pearson's r of the ranks.

  Ties get average ranks (`average_ranks`), the usual tie correction, so rho
  is unchanged by any strictly increasing transform of either input. 0 when
  an input is constant, as for `pearson`.
  """
  a, b = _float_pair(x, y)
  return pearson(average_ranks(a), average_ranks(b))


# --- Tagging -----------------------------------------------------------------


def _flatten_tags(preds: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
  """Flattens padded arrays or ragged per-sentence lists to aligned 1-D."""
  try:
    p, l = np.asarray(preds), np.asarray(labels)
    rectangular = p.dtype != object and l.dtype != object
  except ValueError:  # Ragged nested lists.
    rectangular = False
  if rectangular:
    if p.shape != l.shape:
      raise ValueError(f"preds and labels differ in shape: {p.shape} vs "
                       f"{l.shape}")
    return p.ravel(), l.ravel()
  if len(preds) != len(labels):
    raise ValueError(f"{len(preds)} predicted sequences for {len(labels)} "
                     "labelled ones")
  flat_p, flat_l = [], []
  for i, (sp, sl) in enumerate(zip(preds, labels)):
    sp, sl = np.asarray(sp).ravel(), np.asarray(sl).ravel()
    if sp.shape != sl.shape:
      raise ValueError(f"sequence {i}: {len(sp)} predictions for {len(sl)} "
                       "labels")
    flat_p.append(sp)
    flat_l.append(sl)
  return np.concatenate(flat_p), np.concatenate(flat_l)


def token_accuracy(preds: Any, labels: Any, ignore: int = -100) -> float:
  """Fraction of labelled positions predicted correctly (POS tagging).

  Positions whose label is `ignore` (padding, and the non-first sub-words of
  a word) are left out of both the numerator and the denominator. Takes
  padded arrays of equal shape or ragged lists of per-sentence sequences.
  """
  p, l = _flatten_tags(preds, labels)
  keep = l != ignore
  if not np.any(keep):
    raise ValueError(f"no labelled positions (every label is {ignore})")
  return float(np.mean(p[keep] == l[keep]))


# --- Extractive QA (SQuAD v1.1) ----------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(s: str) -> str:
  """SQuAD v1.1 answer normalisation, so that trivial differences don't count.

  In order: lower-case; delete ASCII punctuation; delete the words a, an and
  the; collapse runs of whitespace to single spaces and strip the ends.
  """
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCTUATION)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _ground_truth_list(ground_truths: str | Sequence[str]) -> Sequence[str]:
  if isinstance(ground_truths, str):  # Iterating a str would give letters.
    return [ground_truths]
  if not ground_truths:
    raise ValueError("no ground-truth answers to compare with")
  return ground_truths


def exact_match(prediction: str, ground_truths: str | Sequence[str]) -> float:
  """1.0 if the normalised prediction equals any normalised ground truth."""
  pred = normalize_answer(prediction)
  return float(any(pred == normalize_answer(g)
                   for g in _ground_truth_list(ground_truths)))


def _token_f1(prediction: str, ground_truth: str) -> float:
  pred_tokens = normalize_answer(prediction).split()
  true_tokens = normalize_answer(ground_truth).split()
  overlap = collections.Counter(pred_tokens) & collections.Counter(true_tokens)
  same = sum(overlap.values())
  if same == 0:  # Also covers an empty side, as in the v1.1 script.
    return 0.0
  precision = same / len(pred_tokens)
  recall = same / len(true_tokens)
  return 2 * precision * recall / (precision + recall)


def span_f1(prediction: str, ground_truths: str | Sequence[str]) -> float:
  """Best bag-of-tokens F1 between the prediction and any ground truth.

  Tokens are the whitespace-separated words of the normalised strings;
  overlap counts shared tokens with multiplicity. Annotators disagree on
  span boundaries, so partial overlap earns partial credit.
  """
  return max(_token_f1(prediction, g)
             for g in _ground_truth_list(ground_truths))


def _answers_by_id(dataset: Any) -> dict[str, list[str]]:
  """Maps question id -> answer texts, from SQuAD JSON or parsed examples."""
  if isinstance(dataset, Mapping) and "data" in dataset:
    dataset = dataset["data"]  # The whole official JSON file.
  answers: dict[str, list[str]] = {}
  for item in dataset:
    if isinstance(item, Mapping):  # An official article dict.
      for paragraph in item["paragraphs"]:
        for qa in paragraph["qas"]:
          answers[qa["id"]] = [a["text"] for a in qa["answers"]]
    else:  # A parsed example with .id and .answers (jaxtl.tasks.readers).
      answers[item.id] = [a.text for a in item.answers]
  return answers


def squad_metrics(predictions: Mapping[str, str],
                  dataset: Any) -> dict[str, float]:
  """Corpus-level SQuAD v1.1 exact match and F1, in percent.

  Args:
    predictions: Question id -> predicted answer text.
    dataset: The official JSON (the whole dict, or its "data" list of
      articles), or parsed examples with `.id` and `.answers` such as
      `jaxtl.tasks.squad.SquadExample`s.

  Returns:
    {"exact_match": ..., "f1": ...}: means over every question in `dataset`,
    times 100. As in the official script, an unanswered question scores 0
    and predictions for unknown ids are ignored.
  """
  answers = _answers_by_id(dataset)
  if not answers:
    raise ValueError("the dataset has no questions")
  em = f1 = 0.0
  for qid, truths in answers.items():
    if qid in predictions:
      em += exact_match(predictions[qid], truths)
      f1 += span_f1(predictions[qid], truths)
  n = len(answers)
  return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


# --- Per-task reporting ------------------------------------------------------

# The metrics each task reports, first the one used to pick checkpoints;
# names follow the GLUE / SQuAD papers.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "trec": ("accuracy", "macro_f1"),
    "imdb": ("accuracy",),
    "cola": ("mcc",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "rte": ("accuracy",),
    "stsb": ("pearson", "spearman"),
    "pos": ("token_accuracy",),
    "squad": ("exact_match", "f1"),
}

# Metrics of a task known only by its kind (task=files): the first selects.
KIND_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "macro_f1"),
    "text_to_text": ("accuracy", "macro_f1"),
    "regression": ("pearson", "spearman"),
    "token_classification": ("token_accuracy",),
}

_METRIC_FNS: dict[str, Callable[[Any, Any], float]] = {
    "accuracy": accuracy,
    "macro_f1": macro_f1,
    "mcc": matthews_corrcoef,
    "f1": f1_binary,
    "pearson": pearson,
    "spearman": spearman,
    "token_accuracy": token_accuracy,
}


def compute_metrics(task: str, preds: Any, labels: Any) -> dict[str, float]:
  """Scores a classification, regression or tagging task by its metrics.

  Args:
    task: A key of `TASK_METRICS` other than "squad" (use `squad_metrics`,
      which needs answer texts rather than arrays), or of `KIND_METRICS`.
    preds: Class ids, regression scores, or per-token tag ids.
    labels: The matching gold values.

  Returns:
    Metric name -> value, in the order of `TASK_METRICS[task]`.
  """
  names = TASK_METRICS.get(task) or KIND_METRICS.get(task)
  if names is None:
    raise ValueError(f"unknown task {task!r}; known tasks: "
                     f"{', '.join(TASK_METRICS)} (or kinds {', '.join(KIND_METRICS)})")
  if task == "squad":
    raise ValueError("score SQuAD with squad_metrics(predictions, dataset)")
  if names == KIND_METRICS["regression"]:  # A head's [N, 1] output scores as [N].
    preds = np.asarray(preds)
    if preds.ndim == np.ndim(labels) + 1 and preds.shape[-1] == 1:
      preds = preds[..., 0]
  return {name: _METRIC_FNS[name](preds, labels) for name in names}

