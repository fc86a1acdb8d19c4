"""BART denoising: shuffled sentences with masked spans in, the original out."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxtl.data.config import DataConfig
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives import denoising
from jaxtl.objectives.base import Example, Objective, Prepared, Row
from jaxtl.objectives.span import SpanConfig, encoder_decoder_example
from jaxtl.sections import key


@dataclasses.dataclass(frozen=True)
class BartConfig(SpanConfig):
  """BART's noise: text infilling's spans, and sentences shuffled."""
  permute_sentence_ratio: float = key(1.0, "share of sentences shuffled")

# What a token that ends a sentence reads as (WikiText's " . ", "?!", ...).
_SENTENCE_END_CHARS = frozenset(".!?")


def sentence_end_table(tokenizer: Tokenizer) -> np.ndarray:
  """[vocab] bool: the ids that end a sentence, EOS (between documents) and
  every piece made only of ``.!?`` (which of the vocabulary's pieces end a
  sentence is found once, here, not per row)."""
  table = np.zeros(tokenizer.vocab_size, bool)
  for i in range(tokenizer.vocab_size):
    text = tokenizer.decode([i]).strip()
    table[i] = bool(text) and set(text) <= _SENTENCE_END_CHARS
  table[tokenizer.eos_id] = True
  return table


def bart_example(row: Row, rng: np.random.Generator, tokenizer: Tokenizer,
                 objective: BartConfig, ends: np.ndarray, length: int) -> Example:
  """Sentence permutation, then text infilling, of the row's tokens (its
  documents in order, EOS between them); the decoder writes the row back."""
  tokens = row["tokens"][row["segment_ids"] > 0]
  permuted = denoising.permute_sentences(tokens, ends[tokens], rng,
                                         objective.permute_sentence_ratio)
  infilled = denoising.text_infill(permuted, rng, mask_id=tokenizer.mask_id,
                                   mask_rate=objective.noise_density,
                                   mean_span=objective.mean_noise_span_length)
  return encoder_decoder_example(infilled.inputs, tokens, tokenizer.pad_id,
                                 length, length)


def prepare(tokenizer: Tokenizer, objective: BartConfig, data: DataConfig) -> Prepared:
  if tokenizer.mask_id is None:
    raise ValueError("the bart objective needs a [MASK] token; the tokenizer "
                     f"{data.tokenizer.path or '(trained)'} has none")
  ends, length = sentence_end_table(tokenizer), data.seq_len
  # Infilling only shortens a row (never more spans than masked tokens), so
  # both sides fit the row's length.
  return Prepared(
      make_example=lambda row, rng: bart_example(row, rng, tokenizer, objective,
                                                 ends, length),
      lengths={"encoder": length, "decoder": length}, row_length=length, eos=True)


OBJECTIVE = Objective("bart", "encoder_decoder", prepare,
                      "BART denoising: shuffled sentences, Poisson(3) spans of 30% "
                      "-> one [MASK] each; the decoder writes the original",
                      config=BartConfig)
