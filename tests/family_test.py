"""The model families as records: each rule and its message once, and every
name a config may hold has one."""

import dataclasses

import pytest

from jaxtl.models import TransformerConfig, family_of
from jaxtl.models.config import FAMILIES, input_side, target_side
from jaxtl.models.family import BY_NAME, Family
from jaxtl.models.heads import POOLINGS, default_pooling


def test_every_config_family_has_its_record():
  assert set(FAMILIES) == set(BY_NAME)
  for name in FAMILIES:
    assert isinstance(family_of(name), Family) and family_of(name).name == name
    assert family_of(TransformerConfig(family=name)) is family_of(name)
    assert family_of(family_of(name)) is family_of(name)


def test_an_unknown_family_is_named():
  with pytest.raises(ValueError, match="unknown model family 'lstm'.*encoder_decoder"):
    family_of("lstm")


def test_the_records_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    family_of("encoder").can_generate = True


@pytest.mark.parametrize("name,inputs,targets", [
    ("encoder", "encoder", "encoder"), ("decoder", "decoder", "decoder"),
    ("encoder_decoder", "encoder", "decoder")])
def test_each_family_reads_and_writes_its_side(name, inputs, targets):
  family = family_of(name)
  assert (family.input_side, family.target_side) == (inputs, targets)
  assert (input_side(name), target_side(name)) == (inputs, targets)


def test_what_each_family_is():
  enc, dec, encdec = (family_of(n) for n in ("encoder", "decoder", "encoder_decoder"))
  assert [f.causal for f in (enc, dec, encdec)] == [False, True, False]
  assert [f.seq2seq for f in (enc, dec, encdec)] == [False, False, True]
  assert [f.masked_lm for f in (enc, dec, encdec)] == [True, False, False]
  assert [f.cls_prefix for f in (enc, dec, encdec)] == [True, False, False]
  assert [f.eos_ends_prompt for f in (enc, dec, encdec)] == [False, False, True]
  assert [f.decoder_start for f in (enc, dec, encdec)] == [None, None, "pad"]
  assert encdec.decoder_start == TransformerConfig().decoder_start


def test_default_pooling_is_cls_for_encoders_only():
  for name in FAMILIES:
    assert family_of(name).default_pooling in POOLINGS
    assert default_pooling(name) == family_of(name).default_pooling
  assert [default_pooling(n) for n in ("encoder", "decoder", "encoder_decoder")] == [
      "first", "mean", "mean"]


def test_forward_args():
  assert family_of("encoder").forward_args("x") == ("x",)
  assert family_of("decoder").forward_args("x") == ("x",)
  assert family_of("encoder_decoder").forward_args("x") == ("x", "x")


def test_only_decoders_generate_and_the_encoder_says_what_to_use():
  for name in ("decoder", "encoder_decoder"):
    family = family_of(name)
    assert family.can_generate and family.generation_error("x") == ""
    family.check_generates("x")
  encoder = family_of("encoder")
  assert not encoder.can_generate
  with pytest.raises(ValueError) as error:
    encoder.check_generates("task kind generation")
  message = str(error.value)
  assert message.startswith("task kind generation: an encoder-only (BERT) model does "
                            "not generate")
  assert "use a decoder (GPT-2) or an encoder-decoder (T5)" in message
  assert message == encoder.generation_error("task kind generation")
  with pytest.raises(ValueError, match="^an encoder-only"):  # no prefix when none is given
    encoder.check_generates()


def test_beam_search_is_for_encoder_decoders():
  family_of("encoder_decoder").check_beam_search("num_beams=4")
  with pytest.raises(ValueError, match="^num_beams=4: beam search is for encoder-decoder "
                     r"\(T5\) models; sample or decode greedily with a decoder-only"):
    family_of("decoder").check_beam_search("num_beams=4")
  with pytest.raises(ValueError, match="^beam search is for encoder-decoder"):
    family_of("decoder").check_beam_search()
  # An encoder cannot generate at all: that is what it is told.
  with pytest.raises(ValueError, match="encoder-only .* does not generate"):
    family_of("encoder").check_beam_search("num_beams=4")
  assert [family_of(n).can_beam_search for n in FAMILIES] == [
      n == "encoder_decoder" for n in FAMILIES]

