"""BART's noising functions (Lewis et al. 2019): sentence permutation and
text infilling, on one 1-D sequence of token ids at a time (with array
operations, no loop over spans: the host pipeline's hot path).

BART's best combination shuffles the sentences of a document, then replaces
spans whose lengths are drawn from Poisson(3), 30% of the tokens in all, by
ONE mask token each; a span of length 0 inserts a mask, so the model must
also learn how many tokens a mask stands for (zero included). The decoder
then writes the original text. T5's span corruption
(:mod:`jaxtl.objectives.corruption`) differs in using a sentinel per span and
writing only the dropped tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def sentence_spans(tokens: np.ndarray, is_end: np.ndarray) -> list[tuple[int, int]]:
  """``[start, stop)`` of each sentence: a sentence ends after a token where
  ``is_end`` holds (a full stop, EOS); trailing tokens form a last one."""
  ends = np.flatnonzero(is_end) + 1
  bounds = np.unique(np.concatenate([[0], ends, [len(tokens)]]))
  return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def permute_sentences(tokens: np.ndarray, is_end: np.ndarray,
                      rng: np.random.Generator, ratio: float = 1.0) -> np.ndarray:
  """``tokens`` with ``ceil(ratio * sentences)`` randomly chosen sentences
  shuffled among their own places (``ratio`` 1: all, as BART; fairseq's
  ``permute_sentence_ratio``). The result is a permutation of whole sentences."""
  if not 0.0 <= ratio <= 1.0:
    raise ValueError(f"permute_sentence_ratio must be in [0, 1], got {ratio}")
  spans = sentence_spans(tokens, is_end)
  order = np.arange(len(spans))
  chosen = rng.permutation(len(spans))[:int(np.ceil(ratio * len(spans)))]
  order[chosen] = rng.permutation(chosen)
  if not len(spans):
    return np.asarray(tokens).copy()
  return np.concatenate([tokens[spans[i][0]:spans[i][1]] for i in order])


@dataclasses.dataclass(frozen=True)
class Infilled:
  """Text infilling of one sequence.

  Attributes:
    inputs: the kept tokens, with one mask token where each span was.
    spans: [masks, 2]: per mask token, in order, the ``[start, stop)`` of
      the original tokens it replaced (``start == stop``: an inserted mask).
  """
  inputs: np.ndarray
  spans: np.ndarray


def infill_span_lengths(num_tokens: int, rng: np.random.Generator,
                        mask_rate: float = 0.3, mean_span: float = 3.0) -> np.ndarray:
  """Span lengths from Poisson(``mean_span``), drawn until they cover
  ``round(mask_rate * num_tokens)`` tokens (the last one cut to fit).

  Zero-length spans stay (they become inserted masks), but there are never
  more spans than masked tokens (a row only shrinks) nor than the kept
  tokens' gaps (each span gets a gap of its own).
  """
  if not 0.0 < mask_rate < 1.0:
    raise ValueError(f"the mask rate (config.objective.noise_density) must be in "
                     f"(0, 1), got {mask_rate}")
  if not mean_span > 0:
    raise ValueError(f"the mean span length (config.objective.mean_noise_span_length)"
                     f" must be positive, got {mean_span}")
  num_masked = int(round(mask_rate * num_tokens))
  if num_masked == 0:
    return np.zeros(0, np.int64)
  # Blocks of draws until their running total covers num_masked; the span
  # that crosses it is cut to fit, and the rest of its block goes unused.
  drawn = np.zeros(0, np.int64)
  while not drawn.size or drawn.sum() < num_masked:
    drawn = np.concatenate([drawn, rng.poisson(mean_span, size=max(8, num_masked))])
  total = np.cumsum(drawn)
  last = int(np.searchsorted(total, num_masked))  # the first to reach it
  out = drawn[:last + 1].copy()
  out[last] -= int(total[last]) - num_masked
  gaps = num_tokens - num_masked + 1
  while len(out) > min(num_masked, gaps):  # drop inserted masks first
    zeros = np.flatnonzero(out == 0)
    if not len(zeros):  # more real spans than gaps: merge the last two
      out = np.concatenate([out[:-2], [out[-2] + out[-1]]])
    else:
      out = np.delete(out, zeros[-1])
  return out


def text_infill(tokens: np.ndarray, rng: np.random.Generator, *, mask_id: int,
                mask_rate: float = 0.3, mean_span: float = 3.0) -> Infilled:
  """BART text infilling of one 1-D sequence.

  The spans (lengths from :func:`infill_span_lengths`, in random order) go
  into distinct random gaps between the kept tokens, so two masks never
  touch and each stands for exactly one span.
  """
  tokens = np.asarray(tokens, np.int32).ravel()
  lengths = rng.permutation(infill_span_lengths(len(tokens), rng, mask_rate, mean_span))
  num_kept = len(tokens) - int(lengths.sum())
  gaps = np.sort(rng.choice(num_kept + 1, size=len(lengths), replace=False))
  # Span i starts after the gaps[i] kept tokens before it and the tokens of
  # the spans before it; its mask goes in front of kept token gaps[i].
  starts = gaps + np.cumsum(lengths) - lengths
  masked = np.zeros(len(tokens) + 1, np.int64)
  np.add.at(masked, starts, 1)
  np.add.at(masked, starts + lengths, -1)
  kept = tokens[np.cumsum(masked[:-1]) == 0]
  inputs = np.insert(kept, gaps, np.int32(mask_id))
  return Infilled(inputs.astype(np.int32), np.stack([starts, starts + lengths], axis=1))


def fill_masks(infilled: Infilled, tokens: np.ndarray, mask_id: int) -> np.ndarray:
  """The inverse of :func:`text_infill`: each mask token replaced by the
  original span it stands for (what the tests check)."""
  pieces, spans = [], iter(infilled.spans)
  for t in infilled.inputs:
    if t == mask_id:
      start, stop = next(spans)
      pieces.append(np.asarray(tokens[start:stop]))
    else:
      pieces.append(np.array([t]))
  return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)
