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
  ex = packing.pad_batch([{"encoder": inputs, "decoder": targets}],
                         {"encoder": inputs_length, "decoder": targets_length},
                         pad_id=pad_id)
  ex = {k: v[0] for k, v in ex.items()}
  dec = ex["decoder"]
  return {"encoder_input_tokens": ex["encoder"],
          "encoder_segment_ids": ex["encoder_segment_ids"],
          "encoder_positions": ex["encoder_positions"],
          "decoder_input_tokens": np.concatenate([[pad_id], dec[:-1]]).astype(np.int32),
          "decoder_target_tokens": dec,
          "decoder_loss_weights": (ex["decoder_segment_ids"] > 0).astype(np.float32),
          "decoder_segment_ids": ex["decoder_segment_ids"],
          "decoder_positions": ex["decoder_positions"]}


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
