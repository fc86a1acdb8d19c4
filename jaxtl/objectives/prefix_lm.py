"""Prefix LM (T5's objective study, UniLM): a row split at a random point;
the prefix is read bidirectionally and the rest is predicted.

Two objectives: ``prefix_lm`` on a decoder-only model (one stack whose
attention is bidirectional within the prefix, causal after it; t5x marks the
prefix with ``decoder_causal_attention``) and ``prefix_lm_encdec`` on an
encoder-decoder (the prefix is the encoder's input, the rest its target).
"""

from __future__ import annotations

import numpy as np

from jaxtl.data.config import DataConfig
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives.base import Example, Objective, ObjectiveConfig, Prepared, Row
from jaxtl.objectives.clm import clm_example
from jaxtl.objectives.span import encoder_decoder_example


def split_points(segment_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """[k + 1] prefix lengths per segment id (index 0, padding, is 0): uniform
  in [1, n - 1] for a segment of n tokens, so each side has a token."""
  n = np.bincount(segment_ids, minlength=segment_ids.max(initial=0) + 1)
  cut = 1 + np.floor(rng.random(len(n)) * np.maximum(n - 1, 0)).astype(np.int64)
  cut = np.where(n >= 2, cut, n)
  cut[0] = 0
  return cut


def prefix_lm_example(row: Row, rng: np.random.Generator) -> Example:
  """Causal LM features of the row, its prefix marked and out of the loss.

  Input position i predicts token i + 1; with a prefix of p tokens, the
  positions from p - 1 on predict the continuation and carry the loss (the
  last prefix position sees only the prefix, so predicting token p is fair).
  """
  ex = clm_example(row)
  seg, pos = ex["decoder_segment_ids"], ex["decoder_positions"]
  cut = split_points(seg, rng)[seg]
  ex["decoder_causal_attention"] = ((seg > 0) & (pos < cut)).astype(np.int32)
  ex["decoder_loss_weights"] = ex["decoder_loss_weights"] * (pos >= cut - 1)
  return ex


def prefix_lm_encdec_example(row: Row, rng: np.random.Generator, pad_id: int,
                             length: int) -> Example:
  """The row's tokens cut once: the prefix in, the rest out."""
  tokens = row["tokens"][row["segment_ids"] > 0]
  (cut,) = split_points(np.ones(len(tokens), np.int64), rng)[1:]
  return encoder_decoder_example(tokens[:cut], tokens[cut:], pad_id, length, length)


def prepare(tokenizer: Tokenizer, objective: ObjectiveConfig, data: DataConfig) -> Prepared:
  del tokenizer, objective  # rows of L + 1 tokens, as causal LM's
  return Prepared(make_example=prefix_lm_example, lengths={"decoder": data.seq_len},
                  row_length=data.seq_len + 1, eos=True)


def prepare_encdec(tokenizer: Tokenizer, objective: ObjectiveConfig, data: DataConfig) -> Prepared:
  del objective
  length = data.seq_len
  return Prepared(
      make_example=lambda row, rng: prefix_lm_encdec_example(row, rng, tokenizer.pad_id,
                                                             length),
      lengths={"encoder": length, "decoder": length}, row_length=length, eos=True)


OBJECTIVE = Objective("prefix_lm", "decoder", prepare,
                      "prefix LM: a random prefix read bidirectionally, the rest "
                      "predicted (prefix_lm_encdec for encoder-decoders)")
ENCDEC_OBJECTIVE = Objective("prefix_lm_encdec", "encoder_decoder", prepare_encdec,
                             "prefix LM on an encoder-decoder: a random prefix in, "
                             "the rest out")
