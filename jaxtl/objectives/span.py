"""T5 span corruption: noise spans become sentinels; the decoder writes them."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from jaxtl.data import corruption, packing
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives.base import Example, Objective, Prepared, Row


def encoder_decoder_example(inputs: np.ndarray, targets: np.ndarray, pad_id: int,
                            inputs_length: int, targets_length: int) -> Example:
  """The features of one (inputs, targets) pair, padded to the lengths; the
  decoder's inputs are its targets shifted right, starting from ``pad_id``
  (T5's start token, which generation starts from too)."""
  enc, enc_segments, enc_positions = packing.pad_one(inputs, inputs_length, pad_id)
  dec, dec_segments, dec_positions = packing.pad_one(targets, targets_length, pad_id)
  dec_inputs = np.empty_like(dec)
  dec_inputs[0], dec_inputs[1:] = pad_id, dec[:-1]
  return {"encoder_input_tokens": enc,
          "encoder_segment_ids": enc_segments,
          "encoder_positions": enc_positions,
          "decoder_input_tokens": dec_inputs,
          "decoder_target_tokens": dec,
          "decoder_loss_weights": dec_segments.astype(np.float32),
          "decoder_segment_ids": dec_segments,
          "decoder_positions": dec_positions}


def span_example(row: Row, rng: np.random.Generator, tokenizer: Tokenizer,
                 objective: Mapping[str, Any], sentinels: np.ndarray,
                 inputs_length: int, targets_length: int) -> Example:
  """T5 span corruption of a row."""
  inputs, targets = corruption.span_corrupt(
      row["tokens"], rng, sentinel_ids=sentinels, eos_id=tokenizer.eos_id,
      noise_density=objective["noise_density"],
      mean_noise_span_length=objective["mean_noise_span_length"])
  return encoder_decoder_example(inputs, targets, tokenizer.pad_id, inputs_length,
                                 targets_length)


def prepare(tokenizer: Tokenizer, objective: Any, data: Any) -> Prepared:
  length = data.seq_len
  raw_length, targets_length = corruption.span_corruption_lengths(
      length, objective.noise_density, objective.mean_noise_span_length)
  sentinels = np.array([tokenizer.sentinel_id(i) for i in range(tokenizer.num_sentinels)],
                       np.int32)
  return Prepared(
      make_example=lambda row, rng: span_example(row, rng, tokenizer, objective,
                                                 sentinels, length, targets_length),
      lengths={"encoder": length, "decoder": targets_length},
      row_length=raw_length, eos=False)


OBJECTIVE = Objective("span", "encoder_decoder", prepare,
                      "T5 span corruption: 15% of tokens in spans of mean 3")
