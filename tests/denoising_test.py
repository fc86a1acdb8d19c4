"""Property tests for jaxtl.objectives.denoising (BART's text infilling and
sentence permutation)."""

import numpy as np
import pytest

from jaxtl.objectives import denoising

MASK, DOT = 3, 4


def test_text_infilling_masks_30_percent_in_poisson_spans_and_fills_back():
  rng = np.random.default_rng(0)
  masked = total = zero_spans = spans = 0
  lengths = []
  for _ in range(300):
    tokens = rng.integers(10, 1000, int(rng.integers(20, 200))).astype(np.int32)
    out = denoising.text_infill(tokens, rng, mask_id=MASK, mask_rate=0.3, mean_span=3.0)
    # Reconstruction: each mask stands for exactly its span; kept tokens stay.
    np.testing.assert_array_equal(denoising.fill_masks(out, tokens, MASK), tokens)
    assert (out.inputs == MASK).sum() == len(out.spans)
    assert len(out.inputs) <= len(tokens)  # a row only shrinks
    assert not np.any((out.inputs[1:] == MASK) & (out.inputs[:-1] == MASK))
    starts = [a for a, _ in out.spans]
    assert starts == sorted(starts)
    n = sum(b - a for a, b in out.spans)
    assert n == round(0.3 * len(tokens))  # exactly the rate, per row
    masked, total = masked + n, total + len(tokens)
    zero_spans += sum(a == b for a, b in out.spans)
    spans += len(out.spans)
    lengths += [b - a for a, b in out.spans]
  assert masked / total == pytest.approx(0.3, abs=0.005)
  # Zero-length spans (inserted masks) exist: Poisson(3) gives 0 w.p. e^-3.
  assert 0.02 < zero_spans / spans < 0.09
  # Span lengths average about 3 (the last span of a row is cut to fit).
  assert 2.5 < np.mean(lengths) < 3.2


def test_span_lengths_never_outnumber_the_masked_tokens():
  rng = np.random.default_rng(1)
  for n in (1, 2, 3, 5, 10):
    for _ in range(50):
      lengths = denoising.infill_span_lengths(n, rng, 0.3, 0.5)  # many zeros
      masked = round(0.3 * n)
      assert lengths.sum() == masked and len(lengths) <= masked
  with pytest.raises(ValueError, match="noise_density"):
    denoising.infill_span_lengths(10, rng, 0.0)


def test_sentence_permutation_is_a_permutation_of_sentences():
  rng = np.random.default_rng(2)
  tokens = np.array([10, 11, DOT, 20, DOT, 30, 31, 32, DOT, 40, 41], np.int32)
  spans = denoising.sentence_spans(tokens, tokens == DOT)
  assert spans == [(0, 3), (3, 5), (5, 9), (9, 11)]
  sentences = sorted(tuple(tokens[a:b]) for a, b in spans)
  seen = set()
  for _ in range(50):
    out = denoising.permute_sentences(tokens, tokens == DOT, rng)
    out_spans = denoising.sentence_spans(out, out == DOT)
    # The last sentence has no full stop: it may now run into the next one.
    pieces = sorted(tuple(out[a:b]) for a, b in out_spans)
    assert sorted(out.tolist()) == sorted(tokens.tolist())
    assert len(pieces) >= len(sentences) - 1
    seen.add(tuple(out))
    assert all(any(tuple(out[i:i + len(s)]) == s for i in range(len(out)))
               for s in sentences)
  assert len(seen) > 10  # 4! orders, most of them drawn
  unchanged = denoising.permute_sentences(tokens, tokens == DOT, rng, ratio=0.0)
  np.testing.assert_array_equal(unchanged, tokens)
