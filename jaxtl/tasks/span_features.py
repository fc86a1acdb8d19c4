"""SQuAD-style questions -> windowed features, and span predictions -> text.

A context longer than the window is cut into overlapping windows (a stride
of ``doc_stride`` tokens), each framed with the question like a sentence
pair: ``[CLS] question [SEP] context-window [SEP]`` for BERT. Labels are the
answer's first and last token in the window; a window that does not hold
the whole answer weighs 0 in the loss. At evaluation every window proposes
its best span and the highest-scoring one across an example's windows is
mapped back to the context through the tokenizer's character offsets, so
metrics compare text with text exactly as the official SQuAD script does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jaxtl.tasks import features as task_features
from jaxtl.tasks.squad import SquadExample
from jaxtl.data.tokenizers import Tokenizer


@dataclasses.dataclass
class SpanFeatures(task_features.Features):
  """Windows plus what maps them back to examples and characters.

  Attributes:
    example_index: [N] the example each window came from.
    offsets: [N, T, 2] each context token's (start, end) character span in
      its example's context; -1 on question, special and padding tokens.
  """
  example_index: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
  offsets: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))


def _answer_tokens(spans: Sequence[tuple[int, int]], start: int, end: int
                   ) -> tuple[int, int]:
  """First and last context token overlapping characters [start, end)."""
  first = next(i for i, (_, e) in enumerate(spans) if e > start)
  last = max(i for i, (s, _) in enumerate(spans) if s < end)
  return first, last


def encode_spans(examples: Sequence[SquadExample], tok: Tokenizer,
                 max_len: int, family: str, *, doc_stride: int = 128,
                 max_question_len: int = 64) -> SpanFeatures:
  """Question + context windows with start/end labels (first answer).

  Args:
    examples: The questions.
    tok: A tokenizer that reports character offsets.
    max_len: Tokens per window, special tokens and question included.
    family: The backbone's family (picks the framing).
    doc_stride: Tokens between the starts of consecutive windows (at most
      half a window, so an answer cut by one window is whole in the next).
    max_question_len: Questions are cut to this many tokens (and to half
      the window).

  Returns:
    The windows; ``truncated`` counts examples that needed more than one.
  """
  prefix, sep, suffix = task_features.frame(tok, family)
  contexts: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
  rows: list[tuple[list[int], int, list[tuple[int, int]], tuple[int, int] | None, int]] = []
  split = 0
  for index, ex in enumerate(examples):
    question = tok.encode(ex.question)[:min(max_question_len, max_len // 2)]
    if ex.context not in contexts:
      contexts[ex.context] = tok.encode_with_offsets(ex.context)
    ctx_ids, ctx_spans = contexts[ex.context]
    budget = max_len - len(prefix) - len(question) - len(sep) - len(suffix)
    if budget < 1:
      raise ValueError(f"max_len={max_len} leaves no room for the context of "
                       f"question {ex.id!r}")
    answer = None
    if ex.answers and ctx_ids:
      a = ex.answers[0]
      answer = _answer_tokens(ctx_spans, a.start, a.end)
    head = prefix + question + sep
    start = 0
    while True:
      stop = min(start + budget, len(ctx_ids))
      label = None
      if answer is not None and start <= answer[0] and answer[1] < stop:
        label = (answer[0] - start + len(head), answer[1] - start + len(head))
      rows.append((head + ctx_ids[start:stop] + suffix, len(head),
                   ctx_spans[start:stop], label, index))
      if stop >= len(ctx_ids):
        break
      start += max(1, min(doc_stride, budget // 2))  # windows always overlap
    split += start > 0

  n = len(rows)
  tokens = np.full((n, max_len), tok.pad_id, np.int32)
  types = np.zeros((n, max_len), np.int32)
  offsets = np.full((n, max_len, 2), -1, np.int32)
  labels = np.zeros((n, 2), np.int32)
  weights = np.zeros((n, 2), np.float32)
  example_index = np.zeros(n, np.int32)
  for i, (ids, ctx_from, spans, label, index) in enumerate(rows):
    tokens[i, :len(ids)] = ids
    types[i, ctx_from:len(ids)] = 1
    offsets[i, ctx_from:ctx_from + len(spans)] = spans
    if label is not None:
      labels[i], weights[i] = label, 1.0
    example_index[i] = index
  arrays = task_features.inputs(tokens, types, tok.pad_id, family, labels, weights)
  arrays["context_mask"] = (offsets[..., 0] >= 0).astype(np.int32)
  return SpanFeatures(arrays, split, example_index, offsets)


def span_texts(examples: Sequence[SquadExample], feats: SpanFeatures,
               spans: np.ndarray) -> dict[str, str]:
  """Question id -> answer text, from per-window (start, end, score) rows.

  The best-scoring window of each example wins; an example with no window
  (cannot happen with SQuAD data) gets no prediction and scores 0.
  """
  best: dict[int, tuple[float, str]] = {}
  for w, (start, end, score) in enumerate(spans):
    ex_i = int(feats.example_index[w])
    if ex_i in best and best[ex_i][0] >= score:
      continue
    char_start = int(feats.offsets[w, int(start), 0])
    char_end = int(feats.offsets[w, int(end), 1])
    if char_start < 0 or char_end < 0:  # not a context token
      continue
    best[ex_i] = (float(score), examples[ex_i].context[char_start:char_end])
  return {examples[i].id: text for i, (_, text) in best.items()}
