"""T5 span corruption: noise spans become sentinels; the decoder writes them."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxtl.data import packing
from jaxtl.data.config import DataConfig
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives import corruption
from jaxtl.objectives.base import (Example, Objective, ObjectiveConfig, Prepared, Rows,
                                   one_row)
from jaxtl.sections import key


@dataclasses.dataclass(frozen=True)
class SpanConfig(ObjectiveConfig):
  """Noise spans: how much of a row is masked out, in spans how long."""
  noise_density: float = key(0.15, "share of tokens masked out")
  mean_noise_span_length: float = key(3.0, "mean length of a masked span (bart: the "
                                           "Poisson mean)")


def encoder_decoder_example(inputs: np.ndarray, targets: np.ndarray, pad_id: int,
                            inputs_length: int, targets_length: int) -> Example:
  """The features of one (inputs, targets) pair: :func:`encoder_decoder_batch`
  of one."""
  batch = encoder_decoder_batch(np.asarray(inputs)[None], np.asarray(targets)[None],
                                pad_id, inputs_length, targets_length)
  return {k: v[0] for k, v in batch.items()}


def encoder_decoder_batch(inputs: np.ndarray, targets: np.ndarray, pad_id: int,
                          inputs_length: int, targets_length: int) -> Example:
  """The features of [B, n] inputs and [B, m] targets, padded (or cut) to
  the lengths; the decoder's inputs are its targets shifted right, starting
  from ``pad_id`` (T5's start token, which generation starts from too)."""
  enc, enc_segments, enc_positions = packing.pad_rows(inputs, inputs_length, pad_id)
  dec, dec_segments, dec_positions = packing.pad_rows(targets, targets_length, pad_id)
  dec_inputs = np.empty_like(dec)
  dec_inputs[:, 0], dec_inputs[:, 1:] = pad_id, dec[:, :-1]
  return {"encoder_input_tokens": enc,
          "encoder_segment_ids": enc_segments,
          "encoder_positions": enc_positions,
          "decoder_input_tokens": dec_inputs,
          "decoder_target_tokens": dec,
          "decoder_loss_weights": dec_segments.astype(np.float32),
          "decoder_segment_ids": dec_segments,
          "decoder_positions": dec_positions}


def span_batch(rows: Rows, rngs: Sequence[np.random.Generator], tokenizer: Tokenizer,
               objective: SpanConfig, sentinels: np.ndarray,
               inputs_length: int, targets_length: int) -> Example:
  """T5 span corruption of stacked rows, each with its generator."""
  inputs, targets = corruption.span_corrupt_rows(
      rows["tokens"], rngs, sentinel_ids=sentinels, eos_id=tokenizer.eos_id,
      noise_density=objective.noise_density,
      mean_noise_span_length=objective.mean_noise_span_length)
  return encoder_decoder_batch(inputs, targets, tokenizer.pad_id, inputs_length,
                               targets_length)


def prepare(tokenizer: Tokenizer, objective: SpanConfig, data: DataConfig) -> Prepared:
  length = data.seq_len
  raw_length, targets_length = corruption.span_corruption_lengths(
      length, objective.noise_density, objective.mean_noise_span_length)
  sentinels = np.array([tokenizer.sentinel_id(i) for i in range(tokenizer.num_sentinels)],
                       np.int32)
  make_batch = lambda rows, rngs: span_batch(rows, rngs, tokenizer, objective, sentinels,
                                             length, targets_length)
  return Prepared(
      make_example=one_row(make_batch), make_batch=make_batch,
      lengths={"encoder": length, "decoder": targets_length},
      row_length=raw_length, eos=False)


OBJECTIVE = Objective("span", "encoder_decoder", prepare,
                      "T5 span corruption: 15% of tokens in spans of mean 3",
                      config=SpanConfig)
