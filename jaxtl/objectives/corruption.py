"""Pretraining corruptions applied on the host: BERT MLM, T5 spans.

Everything here is numpy only and draws all randomness from explicit
`np.random.Generator`s, one per example, so a data loader that seeds them
deterministically gets reproducible batches while still re-masking every
epoch (dynamic masking, as in RoBERTa). Each corruption comes in two forms
with one implementation: ``*_rows`` corrupts a batch of rows at once (the
pipeline's path: array operations over the batch, a single draw from each
row's generator) and the one-sequence form is its batch of one, so an
example comes out the same whichever form or batch made it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _check_unit_interval(name: str, value: float, *, closed: bool) -> None:
  """Raises ValueError unless `value` lies in (0, 1), or [0, 1] if closed."""
  ok = (0.0 <= value <= 1.0) if closed else (0.0 < value < 1.0)
  if not ok:
    bounds = "[0, 1]" if closed else "(0, 1)"
    raise ValueError(f"{name} must be in {bounds}, got {value!r}.")


def _as_1d_tokens(tokens: np.ndarray) -> np.ndarray:
  """Returns `tokens` as a 1-D int32 array; callers pass one example only."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 1:
    raise ValueError(
      f"Expected a 1-D token sequence, got shape {tokens.shape}.")
  if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(
      f"Expected integer token ids, got dtype {tokens.dtype}.")
  return tokens.astype(np.int32)


def _non_special_ids(uniforms: np.ndarray, vocab_size: int,
                     excluded: np.ndarray) -> np.ndarray:
  """Ids uniform over [0, vocab_size) minus the sorted, unique `excluded`,
  one per uniform in [0, 1).

  Rather than materialising the allowed vocabulary (32k+ entries), take the
  rank r = floor(u * #allowed) among the allowed ids and shift it past each
  excluded id at or below it: with excluded ids e_0 < e_1 < ..., the r-th
  allowed id is r + #{i : e_i - i <= r}.
  """
  excluded = excluded[(excluded >= 0) & (excluded < vocab_size)]
  num_allowed = vocab_size - excluded.size
  if num_allowed <= 0:
    raise ValueError(
      "Every id in [0, vocab_size) is special; nothing to sample.")
  ranks = np.minimum((uniforms * num_allowed).astype(np.int64), num_allowed - 1)
  shifted = excluded - np.arange(excluded.size)
  return (ranks + np.searchsorted(shifted, ranks, side="right")).astype(np.int32)


def mlm_mask(
  tokens: np.ndarray,
  rng: np.random.Generator,
  *,
  can_mask: np.ndarray | None = None,
  word_starts: np.ndarray | None = None,
  **options: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """BERT masking of one 1-D int32 sequence -> (inputs, targets, weights).

  `mlm_mask_rows` of a batch of one (the same draws, the same result), which
  documents the masking and ``options`` (mask_id, vocab_size, special_ids
  and the rates); `can_mask` and `word_starts` are like `tokens`.
  """
  tokens = _as_1d_tokens(tokens)
  _check_like(tokens, can_mask=can_mask, word_starts=word_starts)
  row = lambda a: None if a is None else np.asarray(a)[None]
  out = mlm_mask_rows(tokens[None], [rng], can_mask=row(can_mask),
                      word_starts=row(word_starts), **options)
  return tuple(a[0] for a in out)


def mlm_mask_rows(
  tokens: np.ndarray,
  rngs: Sequence[np.random.Generator],
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
  """BERT masking of each row of [B, L] ``tokens`` with its own generator,
  at once -> (inputs, targets, weights), each [B, L].

  Exactly round(mask_rate * n_maskable) positions of a row (at least one
  when anything is maskable) are chosen uniformly without replacement, as
  BERT's and RoBERTa's data pipelines do, instead of an independent coin per
  token: the number of predictions per batch is then stable, which keeps the
  MLM loss scale steady and short sequences from getting zero predictions.

  Each chosen position independently becomes `mask_id` with probability
  `mask_token_rate`, a uniformly drawn non-special id with probability
  `random_token_rate`, and stays unchanged otherwise. `mask_id` is always
  treated as special (never chosen, never drawn as a random replacement).

  Each row takes one draw from its generator, ``L`` uniforms for each of
  three uses: its positions are chosen by the smallest keys among its
  maskable ones, each chosen position's fate by a second uniform, and a
  random id is the third scaled to the non-special vocabulary. The rest is
  array operations over the batch, so a row's result depends on its tokens
  and generator alone, whatever batch it is made in. (Whole-word masking
  then visits each row's words in turn.)

  Args:
    tokens: [B, L] integer token ids (padding included).
    rngs: one generator per row, the source of all its randomness.
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
  _check_unit_interval("mask_rate", mask_rate, closed=False)
  _check_unit_interval("mask_token_rate", mask_token_rate, closed=True)
  _check_unit_interval("random_token_rate", random_token_rate, closed=True)
  if mask_token_rate + random_token_rate > 1.0:
    raise ValueError(
      "mask_token_rate + random_token_rate must be <= 1, got "
      f"{mask_token_rate!r} + {random_token_rate!r} = "
      f"{mask_token_rate + random_token_rate!r}.")
  if vocab_size <= 0:
    raise ValueError(f"vocab_size must be positive, got {vocab_size!r}.")
  tokens = _as_rows(tokens, rngs)
  _check_like(tokens, can_mask=can_mask, word_starts=word_starts)
  batch, length = tokens.shape

  excluded = np.unique(np.append(
    np.asarray(special_ids, dtype=np.int64).ravel(), mask_id))
  maskable = ~np.isin(tokens, excluded)
  if can_mask is not None:
    maskable &= np.asarray(can_mask, dtype=bool)
  candidates = maskable.sum(axis=1)
  budget = np.where(candidates > 0,
                    np.maximum(1, np.rint(mask_rate * candidates)), 0).astype(np.int64)

  draws = np.stack([rng.random((3, length)) for rng in rngs])
  chosen = np.zeros((batch, length), bool)
  if word_starts is None:
    keys = np.where(maskable, draws[:, 0], 2.0)  # unmaskable sort last
    np.put_along_axis(chosen, np.argsort(keys, axis=1),
                      np.arange(length) < budget[:, None], axis=1)
  else:
    for b, rng in enumerate(rngs):
      chosen[b, _choose_words(maskable[b], np.asarray(word_starts[b], bool),
                              int(budget[b]), rng)] = True

  decide = draws[:, 1]
  to_mask = chosen & (decide < mask_token_rate)
  to_random = chosen & (decide >= mask_token_rate) & (
    decide < mask_token_rate + random_token_rate)
  inputs = tokens.copy()
  inputs[to_mask] = mask_id
  if to_random.any():
    inputs[to_random] = _non_special_ids(draws[:, 2][to_random], vocab_size, excluded)
  return inputs, tokens.copy(), chosen.astype(np.float32)


def _as_rows(tokens: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
  """[B, L] int32 token ids, one generator per row; callers pass a batch."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
    raise ValueError(f"Expected [batch, length] integer token ids, got shape "
                     f"{tokens.shape} and dtype {tokens.dtype}.")
  if len(rngs) != tokens.shape[0]:
    raise ValueError(f"{tokens.shape[0]} rows need as many generators, got {len(rngs)}.")
  return tokens.astype(np.int32)


def _check_like(tokens: np.ndarray, **masks: np.ndarray | None) -> None:
  """Raises unless each given mask has the tokens' shape, naming it."""
  for name, mask in masks.items():
    if mask is not None and np.shape(mask) != tokens.shape:
      raise ValueError(f"{name} has shape {np.shape(mask)}, tokens "
                       f"have {tokens.shape}.")


def _choose_words(maskable: np.ndarray, word_starts: np.ndarray, budget: int,
                  rng: np.random.Generator) -> np.ndarray:
  """Positions of whole words, in random order, up to `budget` tokens.

  As BERT's whole-word masking does, words are visited in a random order and
  taken while they fit in the budget (a word that does not fit is skipped,
  a shorter one later may still fit), so no word is ever split and the count
  never exceeds the budget (which bounds the loss positions per row).
  """
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
  _check_unit_interval("noise_density", noise_density, closed=False)
  if not mean_noise_span_length > 0:
    raise ValueError("mean_noise_span_length must be positive, got "
                         f"{mean_noise_span_length!r}.")


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
    raise ValueError(f"inputs_length must be >= 1, got {inputs_length!r}.")

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


def _random_segmentations(keys: np.ndarray, num_items: int,
                           num_segments: int) -> np.ndarray:
  """[B, num_segments] lengths: row b a uniformly random split of num_items
  into non-empty segments, chosen by its ``keys[b]`` (num_items - 1 uniforms).

  The gaps holding the num_segments - 1 smallest keys are the cut points: a
  uniformly random choice of distinct gaps, which is uniform over all
  compositions (the distribution of T5's shuffle trick).
  """
  batch = keys.shape[0]
  if num_segments == 1:
    return np.full((batch, 1), num_items, np.int64)
  cuts = np.sort(np.argpartition(keys, num_segments - 2, axis=1)[:, :num_segments - 1],
                 axis=1) + 1
  bounds = np.concatenate([np.zeros((batch, 1), np.int64), cuts,
                           np.full((batch, 1), num_items, np.int64)], axis=1)
  return np.diff(bounds, axis=1)


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
  just EOS: there is nothing to both keep and predict. This is
  `span_corrupt_rows` of a batch of one (the same draws, the same result).

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
  inputs, targets = span_corrupt_rows(
      _as_1d_tokens(tokens)[None], [rng], sentinel_ids=sentinel_ids, eos_id=eos_id,
      noise_density=noise_density, mean_noise_span_length=mean_noise_span_length)
  return inputs[0], targets[0]


def span_corrupt_rows(
  tokens: np.ndarray,
  rngs: Sequence[np.random.Generator],
  *,
  sentinel_ids: np.ndarray,
  eos_id: int,
  noise_density: float = 0.15,
  mean_noise_span_length: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
  """`span_corrupt` of each row of [B, n] ``tokens`` with its own generator,
  at once: -> (inputs, targets), [B, ...] int32.

  Rows of one length have the same noise and span counts, so the whole batch
  is corrupted with array operations; only the draws are per row (one call
  to each row's generator), so row b's result depends on its tokens and
  ``rngs[b]`` alone, whatever batch it is made in. This is the host
  pipeline's hot loop: per row it is several times cheaper than a loop of
  small numpy calls.
  """
  _check_span_args(noise_density, mean_noise_span_length)
  tokens = _as_rows(tokens, rngs)
  sentinel_ids = np.asarray(sentinel_ids, dtype=np.int32).ravel()
  batch, length = tokens.shape
  eos = np.full((batch, 1), eos_id, np.int32)
  num_noise, num_spans = _noise_counts(length, noise_density, mean_noise_span_length)
  if num_spans == 0:
    return np.concatenate([tokens, eos], axis=1), eos
  if sentinel_ids.size < num_spans:
    raise ValueError(f"{num_spans} noise spans need as many sentinel ids, "
                     f"got {sentinel_ids.size}.")

  # One draw per row: keys for the noise's gaps, then for the rest's.
  keys = np.stack([rng.random(length - 2) for rng in rngs])
  noise_lengths = _random_segmentations(keys[:, :num_noise - 1], num_noise, num_spans)
  keep_lengths = _random_segmentations(keys[:, num_noise - 1:], length - num_noise,
                                       num_spans)
  # Spans alternate keep_0, noise_0, keep_1, noise_1, ...: position p lies in
  # span span_index[p], a noise span when odd, whose sentinel is index // 2.
  span_lengths = np.stack([keep_lengths, noise_lengths], axis=2).reshape(batch, -1)
  span_starts = np.cumsum(span_lengths, axis=1)[:, :-1]
  starts_span = np.zeros((batch, length), bool)
  np.put_along_axis(starts_span, span_starts, True, axis=1)
  span_index = np.cumsum(starts_span, axis=1)
  is_noise = (span_index & 1).astype(bool)
  sentinels = sentinel_ids[span_index >> 1]
  # Inputs keep_0 s_0 keep_1 s_1 ...: a noise span's first token becomes its
  # sentinel, the rest go. Targets s_0 noise_0 s_1 noise_1 ...: the kept
  # token just before each noise span becomes its sentinel. Every row keeps
  # the same number of positions, so each selection reshapes to [B, ...].
  first_noise = starts_span & is_noise
  before_noise = np.zeros_like(first_noise)
  before_noise[:, :-1] = first_noise[:, 1:]
  inputs = np.where(first_noise, sentinels, tokens)[~is_noise | first_noise]
  targets = np.where(before_noise, sentinels, tokens)[is_noise | before_noise]
  return (np.concatenate([inputs.reshape(batch, -1), eos], axis=1),
          np.concatenate([targets.reshape(batch, -1), eos], axis=1))
