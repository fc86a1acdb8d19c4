"""Scores of generated text against references: ROUGE, BLEU, exact match, F1.

ROUGE comes from Google's ``rouge-score`` (the package the T5 and PEGASUS
papers report with) and BLEU from ``sacrebleu`` (Post 2018: one tokenisation,
so numbers compare across papers); writing either by hand would give numbers
that compare with nothing. Exact match and token F1 are the SQuAD v1.1
script's, from :mod:`jaxtl.tasks.metrics`. Every score is in percent (0 to
100), as the papers and ``sacrebleu`` report them.

Each prediction has one or more references (SQuAD: every annotator's
answer): ROUGE, exact match and F1 take the best reference per example,
BLEU counts n-grams against all of them (its multi-reference definition).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jaxtl.tasks import metrics as task_metrics

References = Sequence[Sequence[str]]

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge(predictions: Sequence[str], references: References,
          types: Sequence[str] = ROUGE_TYPES) -> dict[str, float]:
  """Mean ROUGE F-measure per type (Porter stemming, as in the T5 paper),
  each example scored against its best reference."""
  # heavy: rouge_score imports NLTK (~2 s); only generation tasks score ROUGE
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=True)
  totals = dict.fromkeys(types, 0.0)
  for pred, refs in zip(predictions, references):
    scores = scorer.score_multi(list(refs), pred)
    for t in types:
      totals[t] += scores[t].fmeasure
  return {t: 100.0 * totals[t] / len(predictions) for t in types}


def bleu(predictions: Sequence[str], references: References) -> float:
  """Corpus BLEU (sacrebleu's defaults: 13a tokenisation, exponential
  smoothing off) with a variable number of references per example."""
  # ~0.1 s and 120 modules, only for tasks scored by BLEU
  import sacrebleu  # pylint: disable=g-import-not-at-top
  width = max(map(len, references))
  # sacrebleu takes reference streams: stream j holds each example's j-th
  # reference, None where an example has fewer.
  streams = [[refs[j] if j < len(refs) else None for refs in references]
             for j in range(width)]
  return float(sacrebleu.corpus_bleu(list(predictions), streams).score)


def _per_example(fn: Callable[[str, Sequence[str]], float]
                 ) -> Callable[[Sequence[str], References], float]:
  return lambda preds, refs: 100.0 * float(np.mean(
      [fn(p, list(r)) for p, r in zip(preds, refs)]))


_SINGLE: dict[str, Callable[[Sequence[str], References], float]] = {
    "bleu": bleu,
    "exact_match": _per_example(task_metrics.exact_match),
    "f1": _per_example(task_metrics.span_f1),
}
METRICS = (*ROUGE_TYPES, *_SINGLE)


def generation_metrics(names: Sequence[str], predictions: Sequence[str],
                       references: References) -> dict[str, float]:
  """``names`` (of :data:`METRICS`, in that order in the result) of
  ``predictions`` against ``references`` (one or more texts per example)."""
  unknown = [n for n in names if n not in METRICS]
  if unknown:
    raise ValueError(f"unknown generation metric(s) {unknown}; known: {', '.join(METRICS)}")
  if len(predictions) != len(references) or not predictions:
    raise ValueError(f"{len(predictions)} predictions for {len(references)} "
                     "examples: need one per example, and at least one")
  if any(not refs for refs in references):
    raise ValueError("every example needs at least one reference text")
  wanted_rouge = [n for n in names if n in ROUGE_TYPES]
  scores = rouge(predictions, references, wanted_rouge) if wanted_rouge else {}
  return {n: scores[n] if n in scores else _SINGLE[n](predictions, references)
          for n in names}
