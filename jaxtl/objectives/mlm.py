"""Masked LM (BERT): predict 15% of tokens, 80% of them shown as [MASK]."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxtl.data.config import DataConfig
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives import corruption
from jaxtl.objectives.base import (Example, Objective, ObjectiveConfig, Prepared, Rows,
                                   one_row)
from jaxtl.sections import key


@dataclasses.dataclass(frozen=True)
class MaskingConfig(ObjectiveConfig):
  """BERT's masking: which tokens are predicted and what the model sees there."""
  mask_rate: float = key(0.15, "share of tokens chosen for prediction")
  mask_token_rate: float = key(0.8, "share of the chosen tokens replaced by [MASK]")
  random_token_rate: float = key(0.1, "share of the chosen tokens replaced by a "
                                      "random token (the rest stay)")
  whole_word: bool = key(False, "mask whole words (the tokenizer's), not single pieces")


def mlm_batch(rows: Rows, rngs: Sequence[np.random.Generator], tokenizer: Tokenizer,
              objective: MaskingConfig, special_ids: np.ndarray,
              word_starts: np.ndarray | None = None) -> Example:
  """BERT masking of stacked rows, each with its generator (special tokens
  and padding are never chosen); with ``word_starts`` (the tokenizer's, per
  id), of whole words."""
  tokens, seg, pos = rows["tokens"], rows["segment_ids"], rows["positions"]
  inputs, targets, weights = corruption.mlm_mask_rows(
      tokens, rngs, mask_id=tokenizer.mask_id, vocab_size=tokenizer.vocab_size,
      special_ids=special_ids, mask_rate=objective.mask_rate,
      mask_token_rate=objective.mask_token_rate,
      random_token_rate=objective.random_token_rate, can_mask=seg > 0,
      word_starts=None if word_starts is None else word_starts[tokens])
  return {"encoder_input_tokens": inputs, "encoder_target_tokens": targets,
          "encoder_loss_weights": weights, "encoder_segment_ids": seg,
          "encoder_positions": pos}


def prepare(tokenizer: Tokenizer, objective: MaskingConfig, data: DataConfig) -> Prepared:
  if tokenizer.mask_id is None:
    raise ValueError("the mlm objective needs a [MASK] token; the tokenizer "
                     f"{data.tokenizer.path or '(trained)'} has none")
  specials, length = tokenizer.special_ids, data.seq_len
  # Computed once per run from the vocabulary (and a tokenizer that cannot
  # tell word starts fails here, before any training).
  word_starts = tokenizer.word_starts if objective.whole_word else None
  framed = data.packing == "chunk"  # room for [CLS] ... [SEP]
  make_batch = lambda rows, rngs: mlm_batch(rows, rngs, tokenizer, objective, specials,
                                            word_starts)
  return Prepared(
      make_example=one_row(make_batch), make_batch=make_batch,
      lengths={"encoder": length}, row_length=length - 2 if framed else length,
      eos=not framed, framed=framed,
      # mlm_mask chooses round(rate * maskable) <= ceil(rate * L) positions.
      max_predictions=int(np.ceil(objective.mask_rate * length)))


OBJECTIVE = Objective("mlm", "encoder", prepare,
                      "masked LM: 15% of tokens, 80/10/10 [MASK]/random/kept",
                      config=MaskingConfig)
