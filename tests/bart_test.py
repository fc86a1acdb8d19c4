"""The BART objective: the encoder reads shuffled sentences with masked
spans, the decoder writes the row back; which tokens end a sentence."""

import dataclasses

import numpy as np
import pytest

from jaxtl.objectives import denoising
from jaxtl.objectives import bart

import datadir

MASK, DOT, EOS = 3, 4, 1
OBJECTIVE = bart.BartConfig(name="bart", noise_density=0.3, mean_noise_span_length=3.0,
                            permute_sentence_ratio=1.0)


@dataclasses.dataclass
class _Tok:
  pad_id: int = 0
  eos_id: int = EOS
  mask_id: int = MASK


def _row(length=64, pad=0, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(10, 200, length).astype(np.int32)
  tokens[rng.random(length) < 0.15] = DOT
  seg = np.ones(length, np.int32)
  if pad:
    tokens[-pad:], seg[-pad:] = 0, 0
  return {"tokens": tokens, "segment_ids": seg, "positions": np.arange(length)}


@pytest.mark.parametrize("pad", [0, 9])
def test_the_decoder_writes_the_row_back_from_noised_inputs(pad):
  ends = np.zeros(256, bool)
  ends[[DOT, EOS]] = True
  rng = np.random.default_rng(0)
  row = _row(pad=pad)
  original = row["tokens"][row["segment_ids"] > 0]
  masked = 0
  for _ in range(30):
    ex = bart.bart_example(row, rng, _Tok(), OBJECTIVE, ends, 64)
    assert all(v.shape == (64,) for v in ex.values())
    target = ex["decoder_target_tokens"][ex["decoder_loss_weights"] > 0]
    np.testing.assert_array_equal(target, original)  # the whole original, in order
    assert ex["decoder_input_tokens"][0] == 0
    np.testing.assert_array_equal(ex["decoder_input_tokens"][1:],
                                  ex["decoder_target_tokens"][:-1])
    inputs = ex["encoder_input_tokens"][ex["encoder_segment_ids"] > 0]
    kept = inputs[inputs != MASK]
    masked += len(original) - len(kept)
    # What is not masked is the original's tokens, sentences reordered.
    assert not set(kept.tolist()) - set(original.tolist())
  assert masked / (30 * len(original)) == pytest.approx(0.3, abs=0.02)


def test_infilling_is_applied_after_permuting_whole_sentences():
  ends = np.zeros(256, bool)
  ends[[DOT, EOS]] = True
  rng = np.random.default_rng(1)
  tokens = np.array([10, 11, DOT, 20, 21, DOT, 30, DOT], np.int32)
  permuted = denoising.permute_sentences(tokens, ends[tokens], rng)
  infilled = denoising.text_infill(permuted, rng, mask_id=MASK)
  np.testing.assert_array_equal(denoising.fill_masks(infilled, permuted, MASK), permuted)


def test_sentence_ends_of_a_real_vocabulary():
  from jaxtl.data.tokenizer_files import get_tokenizer
  tok = get_tokenizer(datadir.require_data("tokenizers", "t5_c4_32k_100extra.spm.model"))
  ends = bart.sentence_end_table(tok)
  ids = tok.encode("It rained. Did it? Yes! e.g. 3.5 and 1,000")
  marked = {tok.decode([i]).strip() for i in ids if ends[i]}
  assert marked == {".", "?", "!"}
  assert ends[tok.eos_id] and not ends[tok.pad_id]


def test_a_vocabulary_without_a_mask_token_is_named():
  data = type("D", (), {"tokenizer": type("T", (), {"path": "x.model"})(), "seq_len": 8})
  with pytest.raises(ValueError, match=r"\[MASK\].*x.model"):
    bart.prepare(_Tok(mask_id=None), OBJECTIVE, data)


def test_an_eos_started_decoder_is_not_pretrained_from_pad():
  from jaxtl import objectives  # pylint: disable=g-import-not-at-top
  from jaxtl.models import TransformerConfig  # pylint: disable=g-import-not-at-top
  objectives.check_model("bart", TransformerConfig(family="encoder_decoder"))
  with pytest.raises(ValueError, match=r"config.model.decoder_start is 'eos'"):
    objectives.check_model("bart", TransformerConfig(family="encoder_decoder",
                                                     decoder_start="eos"))
