"""Causal LM (GPT): predict every next token of the row."""

from __future__ import annotations


import numpy as np

from jaxtl.data.config import DataConfig
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives.base import Example, Objective, ObjectiveConfig, Prepared, Row


def clm_example(row: Row) -> Example:
  """Next-token prediction; a target in another segment (or padding) has weight 0."""
  tokens, seg, pos = row["tokens"], row["segment_ids"], row["positions"]
  same_segment = (seg[1:] == seg[:-1]) & (seg[1:] > 0)
  return {"decoder_input_tokens": tokens[:-1],
          "decoder_target_tokens": tokens[1:],
          "decoder_loss_weights": same_segment.astype(np.float32),
          "decoder_segment_ids": seg[:-1], "decoder_positions": pos[:-1]}


def prepare(tokenizer: Tokenizer, objective: ObjectiveConfig, data: DataConfig) -> Prepared:
  del tokenizer, objective  # rows of L + 1 tokens give L inputs and L targets
  return Prepared(make_example=lambda row, rng: clm_example(row),
                  lengths={"decoder": data.seq_len}, row_length=data.seq_len + 1,
                  eos=True)


OBJECTIVE = Objective("clm", "decoder", prepare, "causal LM: every next token")
