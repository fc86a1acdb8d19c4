"""Property tests for jaxtl.objectives.corruption (MLM masking, T5 spans)."""

import numpy as np
import pytest

from jaxtl.objectives import corruption

VOCAB = 1000
PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIALS = np.array([PAD, CLS, SEP, MASK, 500])  # 500: special mid-vocab.
SENTINELS = np.arange(VOCAB - 1, VOCAB - 101, -1)  # T5-style <extra_id_i>.
EOS = 1


def _random_sequence(rng, n_real, n_pad):
  body = rng.integers(4, VOCAB, size=n_real)
  body[rng.random(n_real) < 0.02] = 500
  seq = np.concatenate([[CLS], body, [SEP], np.full(n_pad, PAD)])
  return seq.astype(np.int32)


def _mask(tokens, rng, **kw):
  return corruption.mlm_mask(tokens, rng, mask_id=MASK, vocab_size=VOCAB,
                               special_ids=SPECIALS, **kw)


def test_mlm_statistics_and_invariants():
  rng = np.random.default_rng(0)
  n_maskable = n_chosen = n_mask = n_random = n_same = 0
  for _ in range(1500):
    tokens = _random_sequence(rng, int(rng.integers(0, 200)),
                                  int(rng.integers(0, 20)))
    inputs, targets, weights = _mask(tokens, rng)
    assert inputs.dtype == np.int32 and targets.dtype == np.int32
    assert weights.dtype == np.float32
    assert inputs.shape == targets.shape == weights.shape == tokens.shape
    np.testing.assert_array_equal(targets, tokens)
    chosen = weights > 0
    assert set(np.unique(weights)) <= {0.0, 1.0}
    special = np.isin(tokens, SPECIALS)
    assert not (chosen & special).any()
    np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])
    m = int((~special).sum())
    # Exact count per sequence.
    expected = max(1, round(0.15 * m)) if m else 0
    assert chosen.sum() == expected
    changed = inputs[chosen]
    is_mask = changed == MASK
    is_same = changed == tokens[chosen]
    rand = changed[~is_mask]
    # Random replacements are never special (nor mask_id).
    assert not np.isin(rand, SPECIALS).any()
    assert ((rand >= 0) & (rand < VOCAB)).all()
    n_maskable += m
    n_chosen += int(chosen.sum())
    n_mask += int(is_mask.sum())
    # A random draw equal to the original counts as "same"; it happens
    # with probability ~1/995, negligible against the 2-point tolerance.
    n_same += int((~is_mask & is_same).sum())
    n_random += int((~is_mask & ~is_same).sum())
  assert n_chosen > 20000
  assert abs(n_chosen / n_maskable - 0.15) < 0.005
  assert abs(n_mask / n_chosen - 0.8) < 0.02
  assert abs(n_random / n_chosen - 0.1) < 0.02
  assert abs(n_same / n_chosen - 0.1) < 0.02


def test_mlm_random_tokens_cover_non_special_vocab_uniformly():
  vocab = 12
  specials = np.array([0, 3, 4, 11, 40])  # 40 lies outside the vocab.
  rng = np.random.default_rng(1)
  tokens = np.full(5000, 7, dtype=np.int32)
  inputs, _, weights = corruption.mlm_mask(
    tokens, rng, mask_id=5, vocab_size=vocab, special_ids=specials,
    mask_rate=0.5, mask_token_rate=0.0, random_token_rate=1.0)
  drawn = inputs[weights > 0]
  allowed = np.setdiff1d(np.arange(vocab), [0, 3, 4, 5, 11])
  assert set(np.unique(drawn)) == set(allowed)
  counts = np.bincount(drawn, minlength=vocab)[allowed]
  assert counts.min() > 0.8 * drawn.size / allowed.size


def test_mlm_reproducible_and_dynamic():
  tokens = _random_sequence(np.random.default_rng(2), 300, 10)
  a = _mask(tokens, np.random.default_rng(7))
  b = _mask(tokens, np.random.default_rng(7))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  rng = np.random.default_rng(7)
  first = _mask(tokens, rng)
  second = _mask(tokens, rng)  # Same generator, advanced state: a new mask.
  assert not np.array_equal(first[2], second[2])


def test_mlm_can_mask_and_edge_cases():
  rng = np.random.default_rng(3)
  tokens = _random_sequence(rng, 100, 5)
  can_mask = np.zeros(tokens.shape, bool)
  can_mask[10:30] = True
  for _ in range(50):
    _, _, weights = _mask(tokens, rng, can_mask=can_mask)
    chosen = np.flatnonzero(weights)
    assert ((chosen >= 10) & (chosen < 30)).all() and chosen.size >= 1
  # Nothing maskable: no predictions, inputs untouched.
  only_special = np.array([CLS, SEP, PAD, PAD], np.int32)
  inputs, _, weights = _mask(only_special, rng)
  np.testing.assert_array_equal(inputs, only_special)
  assert weights.sum() == 0
  inputs, _, weights = _mask(np.zeros(0, np.int32), rng)
  assert inputs.shape == (0,) and weights.shape == (0,)
  # One maskable token still gets one prediction.
  _, _, weights = _mask(np.array([CLS, 42, SEP], np.int32), rng)
  np.testing.assert_array_equal(weights, [0, 1, 0])


@pytest.mark.parametrize("kwargs, bad", [
  (dict(mask_rate=0.0), "mask_rate"),
  (dict(mask_rate=1.0), "mask_rate"),
  (dict(mask_rate=-0.1), "mask_rate"),
  (dict(mask_token_rate=1.2), "mask_token_rate"),
  (dict(random_token_rate=-0.1), "random_token_rate"),
  (dict(mask_token_rate=0.8, random_token_rate=0.3), "0.3"),
])
def test_mlm_bad_rates_raise(kwargs, bad):
  with pytest.raises(ValueError, match=bad):
    _mask(np.arange(4, 20), np.random.default_rng(0), **kwargs)


def _reconstruct(inputs, targets, eos=EOS):
  """Inverts span corruption: each sentinel in inputs -> its target span."""
  assert inputs[-1] == eos and targets[-1] == eos
  inputs, targets = inputs[:-1], targets[:-1]
  is_sent = np.isin(targets, SENTINELS)
  spans, current = {}, None
  for tok, sent in zip(targets, is_sent):
    if sent:
      current = int(tok)
      spans[current] = []
    else:
      spans[current].append(int(tok))
  out = []
  for tok in inputs:
    out.extend(spans[int(tok)] if int(tok) in spans else [int(tok)])
  return np.array(out, np.int32), [s for s in targets[is_sent]], spans


def test_span_corrupt_reconstructs_and_uses_sentinels_in_order():
  rng = np.random.default_rng(0)
  lengths = list(range(0, 40)) + list(rng.integers(40, 601, size=400))
  for length in lengths:
    tokens = rng.integers(2, VOCAB - 100, size=int(length)).astype(np.int32)
    inputs, targets = corruption.span_corrupt(
      tokens, rng, sentinel_ids=SENTINELS, eos_id=EOS)
    assert inputs.dtype == np.int32 and targets.dtype == np.int32
    rebuilt, sentinels, spans = _reconstruct(inputs, targets)
    np.testing.assert_array_equal(rebuilt, tokens)
    k = len(sentinels)
    np.testing.assert_array_equal(sentinels, SENTINELS[:k])
    np.testing.assert_array_equal(inputs[np.isin(inputs, SENTINELS)],
                                      SENTINELS[:k])
    assert all(len(s) > 0 for s in spans.values())
    if length >= 2:
      # Starts with a non-noise span.
      assert k >= 1 and inputs[0] not in SENTINELS
    else:
      np.testing.assert_array_equal(inputs[:-1], tokens)
      np.testing.assert_array_equal(targets, [EOS])


def test_span_corrupt_noise_density_and_span_length():
  rng = np.random.default_rng(1)
  noise = total = spans = 0
  for _ in range(300):
    tokens = rng.integers(2, 800, size=568).astype(np.int32)
    inputs, targets = corruption.span_corrupt(
      tokens, rng, sentinel_ids=SENTINELS, eos_id=EOS)
    k = int(np.isin(targets, SENTINELS).sum())
    noise += targets.size - 1 - k
    spans += k
    total += tokens.size
  assert abs(noise / total - 0.15) < 0.005
  assert abs(noise / spans - 3.0) < 0.1


def test_span_corrupt_span_lengths_vary():
  rng = np.random.default_rng(2)
  tokens = np.arange(10, 610, dtype=np.int32)
  _, _, spans = _reconstruct(*corruption.span_corrupt(
    tokens, rng, sentinel_ids=SENTINELS, eos_id=EOS))
  assert len({len(s) for s in spans.values()}) > 2


@pytest.mark.parametrize("inputs_length, expected", [
  (512, (568, 114)),  # T5's published numbers for its pretraining setup.
  (64, None), (114, None), (568, None), (2, None), (1, None)])
def test_span_corruption_lengths_is_exact_and_maximal(inputs_length, expected):
  raw, targets_length = corruption.span_corruption_lengths(inputs_length)
  if expected is not None:
    assert (raw, targets_length) == expected
  rng = np.random.default_rng(inputs_length)
  for _ in range(20):
    tokens = rng.integers(2, 800, size=raw).astype(np.int32)
    inputs, targets = corruption.span_corrupt(
      tokens, rng, sentinel_ids=SENTINELS, eos_id=EOS)
    assert inputs.size == inputs_length  # Exactly full rows, not just <=.
    assert targets.size == targets_length
    longer = rng.integers(2, 800, size=raw + 1).astype(np.int32)
    inputs, _ = corruption.span_corrupt(
      longer, rng, sentinel_ids=SENTINELS, eos_id=EOS)
    assert inputs.size > inputs_length  # One more raw token overflows.


@pytest.mark.parametrize("density, mean_span, exact", [
  (0.15, 3.0, True), (0.3, 1.0, True), (0.5, 3.0, True),
  (0.5, 1.0, False), (0.9, 2.0, False)])
def test_span_corruption_lengths_sweep(density, mean_span, exact):
  """For every inputs_length: fits, is maximal, exact for usual settings."""
  rng = np.random.default_rng(11)
  sentinels = np.arange(10_000, 12_000)
  for inputs_length in range(1, 401):
    raw, targets_length = corruption.span_corruption_lengths(
      inputs_length, density, mean_span)
    sizes = []
    for n in (raw, raw + 1):
      inputs, targets = corruption.span_corrupt(
        np.arange(n), rng, sentinel_ids=sentinels, eos_id=EOS,
        noise_density=density, mean_noise_span_length=mean_span)
      sizes.append((inputs.size, targets.size))
    assert sizes[0][0] <= inputs_length < sizes[1][0]
    assert sizes[0][1] == targets_length
    if exact:
      assert sizes[0][0] == inputs_length


def test_span_corrupt_reproducible_and_validates():
  tokens = np.arange(10, 210, dtype=np.int32)
  a = corruption.span_corrupt(tokens, np.random.default_rng(5),
                sentinel_ids=SENTINELS, eos_id=EOS)
  b = corruption.span_corrupt(tokens, np.random.default_rng(5),
                sentinel_ids=SENTINELS, eos_id=EOS)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  with pytest.raises(ValueError, match="sentinel"):
    corruption.span_corrupt(tokens, np.random.default_rng(0),
                sentinel_ids=SENTINELS[:3], eos_id=EOS)
  with pytest.raises(ValueError, match="noise_density"):
    corruption.span_corrupt(tokens, np.random.default_rng(0),
                sentinel_ids=SENTINELS, eos_id=EOS,
                noise_density=1.0)
  with pytest.raises(ValueError, match="mean_noise_span_length"):
    corruption.span_corruption_lengths(512, mean_noise_span_length=0.0)


@pytest.mark.parametrize("whole_word", [False, True])
def test_mlm_mask_rows_is_mlm_mask_of_each_row(whole_word):
  """A row's masking depends on its tokens and generator alone, not on the
  batch it is made in (the pipeline's batches are made that way)."""
  rng = np.random.default_rng(8)
  tokens = np.stack([_random_sequence(rng, 40 - n, n) for n in (0, 3, 17, 40)])
  can_mask = rng.random(tokens.shape) < 0.9
  starts = rng.random(tokens.shape) < 0.6 if whole_word else None
  kw = dict(mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, mask_rate=0.3)
  rows = corruption.mlm_mask_rows(tokens, [np.random.default_rng(i) for i in range(4)],
                                  can_mask=can_mask, word_starts=starts, **kw)
  for i in range(4):
    one = corruption.mlm_mask(tokens[i], np.random.default_rng(i), can_mask=can_mask[i],
                              word_starts=None if starts is None else starts[i], **kw)
    for a, b in zip(rows, one):
      np.testing.assert_array_equal(a[i], b)
  assert rows[2][-1].sum() == 0  # all padding: nothing to mask


def test_span_corrupt_rows_is_span_corrupt_of_each_row():
  """A row's corruption depends on its tokens and generator alone, not on
  the batch it is made in (the pipeline's batches are made that way)."""
  tokens = np.random.default_rng(3).integers(2, 800, size=(6, 142)).astype(np.int32)
  inputs, targets = corruption.span_corrupt_rows(
      tokens, [np.random.default_rng(i) for i in range(6)], sentinel_ids=SENTINELS,
      eos_id=EOS)
  for i in range(6):
    one = corruption.span_corrupt(tokens[i], np.random.default_rng(i),
                                  sentinel_ids=SENTINELS, eos_id=EOS)
    np.testing.assert_array_equal(inputs[i], one[0])
    np.testing.assert_array_equal(targets[i], one[1])
  with pytest.raises(ValueError, match="generators"):
    corruption.span_corrupt_rows(tokens, [np.random.default_rng(0)],
                                 sentinel_ids=SENTINELS, eos_id=EOS)


def test_random_segmentations_are_uniform_over_compositions():
  """7 items in 3 non-empty segments: each of the C(6, 2) = 15 compositions
  about equally often."""
  keys = np.random.default_rng(4).random((30_000, 6))
  lengths = corruption._random_segmentations(keys, 7, 3)  # pylint: disable=protected-access
  assert (lengths > 0).all() and (lengths.sum(axis=1) == 7).all()
  _, counts = np.unique(lengths, axis=0, return_counts=True)
  assert len(counts) == 15
  assert abs(counts / 30_000 - 1 / 15).max() < 0.01


def _words(tokens, word_starts, maskable):
  """Lists of positions, one list per word (a word also starts after any
  unmaskable position)."""
  words, current = [], []
  for i in range(tokens.size):
    if not maskable[i]:
      current = []
      continue
    if word_starts[i] or not current:
      current = []
      words.append(current)
    current.append(i)
  return words


def test_whole_word_masking_covers_whole_words_at_the_rate():
  rng = np.random.default_rng(0)
  n_maskable = n_chosen = 0
  for _ in range(400):
    seq = _random_sequence(rng, rng.integers(20, 120), rng.integers(0, 10))
    starts = rng.random(seq.size) < 0.6  # words of 1.7 tokens on average
    inputs, targets, weights = _mask(seq, rng, word_starts=starts)
    chosen = weights > 0
    maskable = ~np.isin(seq, SPECIALS)
    assert not chosen[~maskable].any(), "a special token or padding was masked"
    for word in _words(seq, starts, maskable):
      assert chosen[word].all() or not chosen[word].any(), (word, chosen[word])
    budget = max(1, round(0.15 * maskable.sum()))
    assert chosen.sum() <= budget  # bounds the loss positions per row
    np.testing.assert_array_equal(inputs[~chosen], seq[~chosen])
    np.testing.assert_array_equal(targets, seq)
    n_maskable += maskable.sum()
    n_chosen += chosen.sum()
  assert abs(n_chosen / n_maskable - 0.15) < 0.01


def test_whole_word_masking_with_one_long_word_and_can_mask():
  rng = np.random.default_rng(1)
  seq = np.array([CLS, 7, 8, 9, 10, SEP, 11, 12, PAD], np.int32)
  starts = np.array([1, 1, 0, 0, 0, 1, 0, 1, 1], bool)
  # 11 follows [SEP]: a word of its own even though marked a continuation.
  for _ in range(50):
    _, _, w = _mask(seq, rng, word_starts=starts, mask_rate=0.5)
    assert w[1:5].all() or not w[1:5].any()
    assert w.sum() <= 4
  _, _, w = _mask(seq, rng, word_starts=starts, mask_rate=0.5,
                  can_mask=np.arange(seq.size) >= 5)
  assert not w[:5].any() and w.sum() >= 1
  with pytest.raises(ValueError, match="word_starts has shape"):
    _mask(seq, rng, word_starts=starts[:3])
