"""Labeled examples -> fixed-length feature arrays for task heads.

Inputs use the same feature names as pretraining (``encoder_*`` for encoder
and encoder-decoder backbones, ``decoder_*`` for causal ones), so a
fine-tuning batch feeds the pretrained stack unchanged. Targets are
``labels`` plus ``label_weights`` (0 for ignored positions: padding rows,
non-first sub-words in tagging).

Layouts:
  encoder (BERT):   [CLS] a [SEP] b [SEP]   token types 0 .. 0 1 .. 1
  decoder (GPT-2):  a [SEP] b <eos>          pooled at the last token
  T5 encoder:       a </s> b </s>
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxtl.data import packing
from jaxtl.tasks.examples import Examples
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models.config import input_side
from jaxtl.models.family import family_of


@dataclasses.dataclass
class Features:
  arrays: dict[str, np.ndarray]
  truncated: int  # examples cut to fit max_len (reported, not an error)

  def __len__(self) -> int:
    return len(self.arrays["labels"])


def frame(tok: Tokenizer, family: str) -> tuple[list[int], list[int], list[int]]:
  """(prefix, separator, suffix) special ids for the backbone's layout."""
  sep = tok.sep_id if tok.sep_id is not None else tok.eos_id
  rules = family_of(family)
  if rules.cls_prefix and tok.cls_id is not None:
    return [tok.cls_id], [sep], [sep]
  if rules.causal:
    return [], [sep], [tok.eos_id]
  return [], [tok.eos_id], [tok.eos_id]


def _fit_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int], bool]:
  """Longest-first truncation of a pair to ``budget`` tokens in total."""
  if len(a) + len(b) <= budget:
    return a, b, False
  a, b = list(a), list(b)
  while len(a) + len(b) > budget:
    (a if len(a) >= len(b) else b).pop()
  return a, b, True


def encode_sequences(examples: Examples, tok: Tokenizer, max_len: int,
                     family: str) -> Features:
  """Sentence or sentence-pair classification / regression features."""
  prefix, sep, suffix = frame(tok, family)
  firsts = tok.encode_batch(examples.texts)
  seconds = tok.encode_batch(examples.text_pairs) if examples.text_pairs else None
  n = len(examples)
  tokens = np.full((n, max_len), tok.pad_id, np.int32)
  types = np.zeros((n, max_len), np.int32)
  truncated = 0
  for i, a in enumerate(firsts):
    if seconds is None:
      budget = max_len - len(prefix) - len(suffix)
      cut = len(a) > budget
      ids, type_ids = prefix + a[:budget] + suffix, []
    else:
      budget = max_len - len(prefix) - len(sep) - len(suffix)
      a, b, cut = _fit_pair(a, seconds[i], budget)
      ids = prefix + a + sep + b + suffix
      type_ids = [0] * len(prefix + a + sep) + [1] * len(b + suffix)
    truncated += cut
    tokens[i, :len(ids)] = ids
    types[i, :len(type_ids)] = type_ids
  labels = np.asarray(examples.labels,
                      np.float32 if examples.label_names is None else np.int32)
  return Features(inputs(tokens, types, tok.pad_id, family, labels,
                          np.ones(n, np.float32)), truncated)


def encode_tagging(examples: Examples, tok: Tokenizer, max_len: int,
                   family: str) -> Features:
  """One label per word, on the word's first sub-word; the rest weigh 0."""
  prefix, _, suffix = frame(tok, family)
  n = len(examples)
  tokens = np.full((n, max_len), tok.pad_id, np.int32)
  labels = np.zeros((n, max_len), np.int32)
  weights = np.zeros((n, max_len), np.float32)
  truncated = 0
  budget = max_len - len(prefix) - len(suffix)
  for i, (words, tags) in enumerate(zip(examples.words, examples.labels)):
    ids, first = list(prefix), []
    for piece_ids, tag in zip(tok.encode_batch(words), tags):
      piece_ids = piece_ids or [tok.unk_id]
      if len(ids) + len(piece_ids) - len(prefix) > budget:
        truncated += 1
        break
      first.append((len(ids), tag))
      ids += piece_ids
    ids += suffix
    tokens[i, :len(ids)] = ids
    for pos, tag in first:
      labels[i, pos], weights[i, pos] = tag, 1.0
  return Features(inputs(tokens, np.zeros_like(tokens), tok.pad_id, family,
                          labels, weights), truncated)


def label_sequences(words: tuple[str, ...], tok: Tokenizer) -> tuple[tuple[int, ...], ...]:
  """Each label's text as decoder targets (tokens + EOS), padded to one length."""
  seqs = [tok.encode(w) + [tok.eos_id] for w in words]
  width = max(map(len, seqs))
  return tuple(tuple(s + [tok.pad_id] * (width - len(s))) for s in seqs)


def inputs(tokens: np.ndarray, types: np.ndarray, pad_id: int, family: str,
           labels: np.ndarray, weights: np.ndarray) -> dict[str, Any]:
  """The model's input features (named for its side) plus targets."""
  side = input_side(family)
  segment = (tokens != pad_id).astype(np.int32)
  positions = packing.row_positions(tokens.shape)
  return {f"{side}_input_tokens": tokens, f"{side}_segment_ids": segment,
          f"{side}_positions": positions, f"{side}_token_type_ids": types,
          "labels": labels, "label_weights": weights}
