"""Pretraining corruptions applied per example on the host: BERT MLM, T5 spans.

Everything here is numpy only, works on one 1-D token sequence at a time and
draws all randomness from an explicit `np.random.Generator`, so a data loader
that seeds its generator deterministically gets reproducible batches while
still re-masking every epoch (dynamic masking, as in RoBERTa).
"""

from __future__ import annotations

import numpy as np


def _check_unit_interval(name: str, value: float, *, closed: bool) -> None:
  """Raises ValueError unless `value` lies in (0, 1), or [0, 1] if closed."""
  ok = (0.0 <= value <= 1.0) if closed else (0.0 < value < 1.0)
  if not ok:
    bounds = '[0, 1]' if closed else '(0, 1)'
    raise ValueError(f'{name} must be in {bounds}, got {value!r}.')


def _as_1d_tokens(tokens: np.ndarray) -> np.ndarray:
  """Returns `tokens` as a 1-D int32 array; callers pass one example only."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 1:
    raise ValueError(
      f'Expected a 1-D token sequence, got shape {tokens.shape}.')
  if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(
      f'Expected integer token ids, got dtype {tokens.dtype}.')
  return tokens.astype(np.int32)


def _sample_non_special(rng: np.random.Generator, size: int, vocab_size: int,
            excluded: np.ndarray) -> np.ndarray:
  """Draws `size` ids uniformly from [0, vocab_size) minus `excluded`.

  Rather than materialising the allowed vocabulary (32k+ entries) for every
  example, draw a rank r among the allowed ids and shift it past each excluded
  id at or below it: with excluded ids e_0 < e_1 < ..., the r-th allowed id is
  r + #{i : e_i - i <= r}.
  """
  excluded = np.unique(excluded[(excluded >= 0) & (excluded < vocab_size)])
  num_allowed = vocab_size - excluded.size
  if num_allowed <= 0:
    raise ValueError(
      'Every id in [0, vocab_size) is special; nothing to sample.')
  ranks = rng.integers(0, num_allowed, size=size)
  shifted = excluded - np.arange(excluded.size)
  ids = ranks + np.searchsorted(shifted, ranks, side='right')
  return ids.astype(np.int32)


def mlm_mask(
  tokens: np.ndarray,
  rng: np.random.Generator,
  *,
  mask_id: int,
  vocab_size: int,
  special_ids: np.ndarray,
  mask_rate: float = 0.15,
  mask_token_rate: float = 0.8,
  random_token_rate: float = 0.1,
  can_mask: np.ndarray | None = None,
  word_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """BERT masking of one 1-D int32 sequence -> (inputs, targets, weights).

  Exactly round(mask_rate * n_maskable) positions (at least one when anything
  is maskable) are chosen uniformly without replacement, as BERT's and
  RoBERTa's data pipelines do, instead of an independent coin per token: the
  number of predictions per batch is then stable, which keeps the MLM loss
  scale steady and short sequences from getting zero predictions.

  Each chosen position independently becomes `mask_id` with probability
  `mask_token_rate`, a uniformly drawn non-special id with probability
  `random_token_rate`, and stays unchanged otherwise. `mask_id` is always
  treated as special (never chosen, never drawn as a random replacement).

  Args:
    tokens: 1-D integer token ids of one example (padding included).
    rng: source of all randomness.
    mask_id: id of the [MASK] token.
    vocab_size: token ids lie in [0, vocab_size); random replacements
      are drawn from its non-special part.
    special_ids: ids never chosen nor drawn (padding, CLS, SEP, ...).
    mask_rate: fraction of maskable positions to predict, in (0, 1).
    mask_token_rate: probability a chosen position becomes `mask_id`.
    random_token_rate: probability a chosen position becomes a random id.
    can_mask: optional boolean array like `tokens`; False forbids a position
      (e.g. to skip a prompt).
    word_starts: optional boolean array like `tokens` (whole-word masking):
      True where a token begins a word. Whole words are then chosen, about
      round(mask_rate * n_maskable) tokens' worth (see `_choose_words`); a
      word also begins after any position that cannot be masked.

  Returns:
    inputs: int32 corrupted tokens.
    targets: int32 original tokens at every position (weights select
      the loss).
    weights: float32, 1.0 at chosen positions and 0.0 elsewhere.
  """
  _check_unit_interval('mask_rate', mask_rate, closed=False)
  _check_unit_interval('mask_token_rate', mask_token_rate, closed=True)
  _check_unit_interval('random_token_rate', random_token_rate, closed=True)
  if mask_token_rate + random_token_rate > 1.0:
    raise ValueError(
      'mask_token_rate + random_token_rate must be <= 1, got '
      f'{mask_token_rate!r} + {random_token_rate!r} = '
      f'{mask_token_rate + random_token_rate!r}.')
  if vocab_size <= 0:
    raise ValueError(f'vocab_size must be positive, got {vocab_size!r}.')

  tokens = _as_1d_tokens(tokens)
  excluded = np.append(
    np.asarray(special_ids, dtype=np.int64).ravel(), mask_id)
  maskable = ~np.isin(tokens, excluded)
  if can_mask is not None:
    can_mask = np.asarray(can_mask, dtype=bool)
    if can_mask.shape != tokens.shape:
      raise ValueError(f'can_mask has shape {can_mask.shape}, tokens '
                             f'have {tokens.shape}.')
    maskable &= can_mask

  candidates = np.flatnonzero(maskable)
  num_chosen = 0
  if candidates.size:
    num_chosen = max(1, int(round(mask_rate * candidates.size)))
  if word_starts is None:
    chosen = rng.choice(candidates, size=num_chosen, replace=False)
  else:
    chosen = _choose_words(maskable, word_starts, num_chosen, rng)
    num_chosen = chosen.size

  # One uniform per chosen position decides mask / random / keep.
  u = rng.random(num_chosen)
  to_mask = u < mask_token_rate
  to_random = ((u >= mask_token_rate)
                 & (u < mask_token_rate + random_token_rate))

  inputs = tokens.copy()
  inputs[chosen[to_mask]] = mask_id
  num_random = int(to_random.sum())
  if num_random:
    inputs[chosen[to_random]] = _sample_non_special(
      rng, num_random, vocab_size, excluded)

  weights = np.zeros(tokens.shape, dtype=np.float32)
  weights[chosen] = 1.0
  return inputs, tokens.copy(), weights


def _choose_words(maskable: np.ndarray, word_starts: np.ndarray, budget: int,
                  rng: np.random.Generator) -> np.ndarray:
  """Positions of whole words, in random order, up to `budget` tokens.

  As BERT's whole-word masking does, words are visited in a random order and
  taken while they fit in the budget (a word that does not fit is skipped,
  a shorter one later may still fit), so no word is ever split and the count
  never exceeds the budget (which bounds the loss positions per row).
  """
  word_starts = np.asarray(word_starts, dtype=bool)
  if word_starts.shape != maskable.shape:
    raise ValueError(f'word_starts has shape {word_starts.shape}, tokens '
                     f'have {maskable.shape}.')
  after_unmaskable = ~np.concatenate([[False], maskable[:-1]])
  starts = np.flatnonzero(maskable & (word_starts | after_unmaskable))
  if not starts.size:
    return np.zeros(0, dtype=np.int64)
  # Word k spans starts[k] up to its first unmaskable position or next start.
  word_of = np.cumsum(np.isin(np.arange(maskable.size), starts)) - 1
  positions = np.flatnonzero(maskable)
  lengths = np.bincount(word_of[positions], minlength=starts.size)
  taken, total = [], 0
  for k in rng.permutation(starts.size):
    if total + lengths[k] <= budget:
      taken.append(k)
      total += lengths[k]
      if total == budget:
        break
  return positions[np.isin(word_of[positions], taken)]


def _noise_counts(tokens_length: int, noise_density: float,
                  mean_noise_span_length: float) -> tuple[int, int]:
  """Returns (num_noise_tokens, num_noise_spans) for a raw sequence length.

  Shared by `span_corrupt` and `span_corruption_lengths` so the promised
  lengths are exactly the produced ones. Sequences shorter than 2 are not
  corrupted; otherwise there is at least one noise and one non-noise token,
  and at most as many spans as either kind has tokens (spans are non-empty).
  """
  if tokens_length < 2:
    return 0, 0
  num_noise = int(round(tokens_length * noise_density))
  num_noise = min(max(num_noise, 1), tokens_length - 1)
  num_spans = max(1, int(round(num_noise / mean_noise_span_length)))
  num_spans = min(num_spans, num_noise, tokens_length - num_noise)
  return num_noise, num_spans


def _check_span_args(noise_density: float,
                     mean_noise_span_length: float) -> None:
  _check_unit_interval('noise_density', noise_density, closed=False)
  if not mean_noise_span_length > 0:
    raise ValueError('mean_noise_span_length must be positive, got '
                         f'{mean_noise_span_length!r}.')


def span_corruption_lengths(
  inputs_length: int,
  noise_density: float = 0.15,
  mean_noise_span_length: float = 3.0,
) -> tuple[int, int]:
  """-> (raw_tokens_length, targets_length) for T5 span corruption.

  Pretraining wants full input rows, so we take as many raw tokens as possible
  such that, after replacing each noise span with one sentinel and appending
  EOS, the inputs are at most `inputs_length` long (the same search as T5's
  `random_spans_helper`). The corrupted length is non-decreasing in the raw
  length and, for the usual settings (noise_density <= 0.3, or <= 0.5 with
  mean_noise_span_length >= 2; T5 uses 0.15 and 3), grows by at most one per
  extra raw token, so the bound is then met exactly. With denser noise made
  of very short spans it can step by two, and the inputs may come out one
  token short. `targets_length` (noise tokens + one sentinel per span + EOS)
  is the exact targets length for the returned raw length.
  """
  _check_span_args(noise_density, mean_noise_span_length)
  if inputs_length < 1:
    raise ValueError(f'inputs_length must be >= 1, got {inputs_length!r}.')

  def corrupted_lengths(tokens_length: int) -> tuple[int, int]:
    noise, spans = _noise_counts(tokens_length, noise_density,
                                     mean_noise_span_length)
    return tokens_length - noise + spans + 1, noise + spans + 1

  # Spans never outnumber noise tokens, so the corrupted inputs are at most
  # raw length + 1 (EOS): inputs_length - 1 raw tokens always fit. Walk up.
  tokens_length = inputs_length - 1
  while corrupted_lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  return tokens_length, corrupted_lengths(tokens_length)[1]


def _random_segmentation(rng: np.random.Generator, num_items: int,
                         num_segments: int) -> np.ndarray:
  """Lengths of a uniformly random split of num_items into non-empty segments.

  Picking num_segments - 1 distinct cut points among the num_items - 1 gaps is
  uniform over all compositions, the same distribution as T5's shuffle trick.
  """
  cuts = np.sort(rng.choice(num_items - 1, size=num_segments - 1,
                              replace=False) + 1)
  return np.diff(np.concatenate([[0], cuts, [num_items]]))


def span_corrupt(
  tokens: np.ndarray,
  rng: np.random.Generator,
  *,
  sentinel_ids: np.ndarray,
  eos_id: int,
  noise_density: float = 0.15,
  mean_noise_span_length: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
  """T5 span corruption of one 1-D sequence of raw tokens (no EOS).

  The noise/non-noise token counts are fixed by the length (see
  `span_corruption_lengths`); both are split into the same number of random
  non-empty spans, interleaved starting with non-noise as T5 does. Span i is
  replaced in the inputs by `sentinel_ids[i]`; the targets list, for each
  span, its sentinel followed by the dropped tokens, then EOS.

  Sequences shorter than 2 tokens are returned uncorrupted with targets of
  just EOS: there is nothing to both keep and predict.

  Args:
    tokens: 1-D integer raw token ids, without EOS.
    rng: source of all randomness.
    sentinel_ids: distinct ids, one per span in order (e.g. T5's
      <extra_id_0..99>).
    eos_id: appended to both inputs and targets.
    noise_density: fraction of tokens to drop, in (0, 1).
    mean_noise_span_length: average number of tokens per dropped span.

  Returns:
    (inputs, targets), int32, each ending in `eos_id`.

  Raises:
    ValueError: on bad rates or fewer sentinel ids than spans.
  """
  _check_span_args(noise_density, mean_noise_span_length)
  tokens = _as_1d_tokens(tokens)
  sentinel_ids = np.asarray(sentinel_ids, dtype=np.int32).ravel()
  eos = np.array([eos_id], dtype=np.int32)
  length = tokens.size
  num_noise, num_spans = _noise_counts(length, noise_density,
                                         mean_noise_span_length)
  if num_spans == 0:
    return np.concatenate([tokens, eos]), eos.copy()
  if sentinel_ids.size < num_spans:
    raise ValueError(f'{num_spans} noise spans need as many sentinel ids, '
                         f'got {sentinel_ids.size}.')

  noise_lengths = _random_segmentation(rng, num_noise, num_spans)
  keep_lengths = _random_segmentation(rng, length - num_noise, num_spans)
  # Alternate keep_0, noise_0, keep_1, noise_1, ...; odd spans are noise.
  span_lengths = np.stack([keep_lengths, noise_lengths], axis=1).ravel()
  is_noise = np.repeat(np.tile(np.array([False, True]), num_spans), span_lengths)
  # Built from the spans directly rather than by finding runs in is_noise
  # (the host pipeline's hot loop): inputs are keep_0 s_0 keep_1 s_1 ...,
  # targets s_0 noise_0 s_1 noise_1 ..., each then EOS.
  spans = np.arange(num_spans)
  sentinels = sentinel_ids[:num_spans]
  return (_interleave(tokens[~is_noise], np.cumsum(keep_lengths) + spans, sentinels, eos_id),
          _interleave(tokens[is_noise], np.cumsum(noise_lengths) - noise_lengths + spans,
                      sentinels, eos_id))


def _interleave(tokens: np.ndarray, at: np.ndarray, sentinels: np.ndarray,
                eos_id: int) -> np.ndarray:
  """``tokens`` with ``sentinels`` at output positions ``at``, then EOS."""
  out = np.empty(tokens.size + sentinels.size + 1, np.int32)
  is_sentinel = np.zeros(out.size, bool)
  is_sentinel[at] = True
  is_sentinel[-1] = True
  out[is_sentinel] = np.append(sentinels, eos_id)
  out[~is_sentinel] = tokens
  return out
