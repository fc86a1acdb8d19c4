"""MLM plus a sentence-pair task on ``[CLS] A [SEP] B [SEP]`` examples:
BERT's next-sentence prediction (``mlm_nsp``) and ALBERT's sentence-order
prediction (``mlm_sop``). How pairs are drawn: :mod:`.sentence_pairs`.

The loss is the MLM loss plus the mean cross-entropy of the model's
sentence head (``config.model.sentence_classes=2``) on ``sentence_labels``;
segments A and B get token types 0 and 1 (``config.model.type_vocab_size=2``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives import sentence_pairs
from jaxtl.objectives.base import Example, Objective, Prepared, Row
from jaxtl.objectives.mlm import mlm_example

MODEL_NEEDS = {"type_vocab_size": 2, "sentence_classes": 2}


def pair_example(row: Row, rng: np.random.Generator, task: str, length: int,
                 tokenizer: Tokenizer, objective: Any, special_ids: np.ndarray,
                 ids: tuple[int, int], partner: Row | None = None) -> Example:
  """A masked sentence pair of ``length`` tokens and its label (NSP's random
  B from ``partner``, another row, when given)."""
  docs = sentence_pairs.row_documents(row, tokenizer.eos_id)
  others = (None if partner is None else
            sentence_pairs.row_documents(partner, tokenizer.eos_id))
  a, b, label = sentence_pairs.sentence_pair(docs, length - 3, task, rng, others)
  framed = sentence_pairs.frame_pair(a, b, length, cls_id=ids[0], sep_id=ids[1],
                                     pad_id=tokenizer.pad_id)
  example = mlm_example(framed, rng, tokenizer, objective, special_ids)
  example["encoder_token_type_ids"] = framed["token_types"]
  example["sentence_labels"] = np.int32(label)
  return example


def _prepare(task: str):
  def prepare(tokenizer: Tokenizer, objective: Any, data: Any) -> Prepared:
    name = f"mlm_{task}"
    if tokenizer.mask_id is None:
      raise ValueError(f"the {name} objective needs a [MASK] token; the tokenizer "
                       f"{data.tokenizer.path or '(trained)'} has none")
    length = data.seq_len
    if length < 5:
      raise ValueError(f"config.data.seq_len={length}: {name} needs room for "
                       "[CLS] A [SEP] B [SEP] (5 tokens or more)")
    ids = (tokenizer.cls_id if tokenizer.cls_id is not None else tokenizer.bos_id,
           tokenizer.sep_id if tokenizer.sep_id is not None else tokenizer.eos_id)
    specials = tokenizer.special_ids
    return Prepared(
        make_example=lambda row, rng, partner=None: pair_example(
            row, rng, task, length, tokenizer, objective, specials, ids, partner),
        lengths={"encoder": length},
        # A window of several pairs, documents ended by EOS (module doc).
        row_length=sentence_pairs.PAIR_WINDOW * (length - 3), eos=True,
        max_predictions=int(np.ceil(objective.mask_rate * length)),
        partner=task == "nsp")  # NSP's random next from the whole corpus
  return prepare


NSP = Objective("mlm_nsp", "encoder", _prepare("nsp"),
                "masked LM + next-sentence prediction (BERT)", model_needs=MODEL_NEEDS)
SOP = Objective("mlm_sop", "encoder", _prepare("sop"),
                "masked LM + sentence-order prediction (ALBERT)", model_needs=MODEL_NEEDS)
