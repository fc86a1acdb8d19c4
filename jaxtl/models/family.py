"""The three model families as records: what each one reads, writes and can do.

``TransformerConfig.family`` stays a name (checkpoints, config files and
``model_config.json`` store it); code that must act differently per family
asks the family's record (:func:`family_of`) instead of comparing names, so
each rule ("an encoder does not generate", "beam search is for
encoder-decoders") and its message is written once, here.

This module imports nothing from jaxtl: ``jaxtl.models.config`` builds on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

_NO_GENERATION = ("an encoder-only (BERT) model does not generate text or score a "
                  "continuation's likelihood; use a decoder (GPT-2) or an "
                  "encoder-decoder (T5) model")
_NO_BEAM_SEARCH = ("beam search is for encoder-decoder (T5) models; sample or decode "
                   "greedily with a decoder-only (GPT-2) one")


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family's rules.

  Attributes:
    name: What ``TransformerConfig.family`` holds.
    input_side: Which batch features (``encoder_*`` / ``decoder_*``) its
      first (or only) stack reads: causal models read ``decoder_*``; BERT
      and T5's encoder ``encoder_*`` (T5 also reads ``decoder_*`` for its
      decoder).
    target_side: Which batch features carry its LM targets: the encoder's
      for masked LM, the decoder's for causal and encoder-decoder models.
    causal: One causal stack reads the input and writes what follows it in
      the same row (GPT-2): prompt plus output must fit in ``max_len``, a
      scored continuation needs a context token to be predicted from, and
      the output continues the prompt's text.
    seq2seq: A separate decoder writes while attending to an encoder's
      output (T5, BART): the model takes (encoder tokens, decoder tokens),
      encodes with ``method="encode"`` and starts decoding from
      ``decoder_start``.
    masked_lm: Its LM loss falls on a few masked positions (BERT's MLM), so
      a loss may gather just those before the LM head.
    can_generate: It writes text (and so scores a continuation's
      likelihood); an encoder only reads.
    can_beam_search: :mod:`jaxtl.decoding.generate` runs beam search for it.
    default_pooling: What a task head pools when ``config.task.pooling`` is
      empty: [CLS] (``first``) for BERT-style encoders, the token mean for
      the others. A T5 encoder has no [CLS]. In a causal model only the last
      token has seen the whole text, but for a question that token is
      usually "?", whose state is tuned to predict what comes after a
      question: on TREC-6 with a pretrained 4-layer CLM, the mean beat it by
      5 points (71.8 vs 66.8% at 500 labels).
    cls_prefix: Task inputs start with [CLS] (when the tokenizer has one)
      and separate sentences with [SEP], BERT's framing.
    eos_ends_prompt: A prompt to generate from ends with EOS, as the
      encoder's inputs did in training (T5); a causal model continues the
      prompt, so it must not.
    decoder_start: What jaxtl's own pretraining starts the decoder from
      (``TransformerConfig.decoder_start``); None without a separate decoder.
  """
  name: str
  input_side: str
  target_side: str
  causal: bool = False
  seq2seq: bool = False
  masked_lm: bool = False
  can_generate: bool = True
  can_beam_search: bool = False
  default_pooling: str = "mean"
  cls_prefix: bool = False
  eos_ends_prompt: bool = False
  decoder_start: str | None = None

  def generation_error(self, what: str = "") -> str:
    """Why this family cannot do ``what`` (generate, score text), naming
    what to use instead; "" when it can."""
    if self.can_generate:
      return ""
    return f"{what}: {_NO_GENERATION}" if what else _NO_GENERATION

  def check_generates(self, what: str = "") -> None:
    """Fails, saying what to use instead, unless the family writes text."""
    if not self.can_generate:
      raise ValueError(self.generation_error(what))

  def check_beam_search(self, what: str = "") -> None:
    """Fails unless the family can generate with beam search."""
    self.check_generates(what)
    if not self.can_beam_search:
      raise ValueError(f"{what}: {_NO_BEAM_SEARCH}" if what else _NO_BEAM_SEARCH)

  def forward_args(self, tokens_BT: Any) -> tuple[Any, ...]:
    """The positional token arguments of the model's ``init`` / ``apply``
    with ``tokens_BT`` as every input: (encoder, decoder) for seq2seq."""
    return (tokens_BT, tokens_BT) if self.seq2seq else (tokens_BT,)


ENCODER = Family("encoder", input_side="encoder", target_side="encoder",
                 masked_lm=True, can_generate=False, default_pooling="first",
                 cls_prefix=True)
DECODER = Family("decoder", input_side="decoder", target_side="decoder", causal=True)
ENCODER_DECODER = Family("encoder_decoder", input_side="encoder", target_side="decoder",
                         seq2seq=True, can_beam_search=True, eos_ends_prompt=True,
                         decoder_start="pad")
BY_NAME = {f.name: f for f in (ENCODER, DECODER, ENCODER_DECODER)}
NAMES = tuple(BY_NAME)


def family_of(config_or_name: Any) -> Family:
  """The record of a family name, or of a config's (anything with a
  ``family`` name: ``TransformerConfig``, an objective, a task spec)."""
  name = getattr(config_or_name, "family", config_or_name)
  if isinstance(name, Family):
    return name
  if name not in BY_NAME:
    raise ValueError(f"unknown model family {name!r}; expected one of {NAMES}")
  return BY_NAME[name]
