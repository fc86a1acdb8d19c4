"""MLM plus a sentence-pair task on ``[CLS] A [SEP] B [SEP]`` examples:
BERT's next-sentence prediction (``mlm_nsp``) and ALBERT's sentence-order
prediction (``mlm_sop``). How pairs are drawn: :mod:`.sentence_pairs`.

The loss is the MLM loss plus the mean cross-entropy of the model's
sentence head (``config.model.sentence_classes=2``) on ``sentence_labels``;
segments A and B get token types 0 and 1 (``config.model.type_vocab_size=2``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxtl.data import row_store
from jaxtl.data.config import DataConfig
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.objectives import losses, sentence_pairs
from jaxtl.objectives.base import Example, Objective, Prepared, Rows, one_row
from jaxtl.objectives.mlm import MaskingConfig, mlm_batch

MODEL_NEEDS = {"type_vocab_size": 2, "sentence_classes": 2}


def pair_batch(rows: Rows, rngs: Sequence[np.random.Generator], task: str, length: int,
               tokenizer: Tokenizer, objective: MaskingConfig, special_ids: np.ndarray,
               ids: tuple[int, int], partners: Rows | None = None) -> Example:
  """Masked sentence pairs of ``length`` tokens and their labels, one per
  stacked row (NSP's random B from the row's partner, another row, when
  given). Pairs are drawn row by row; the masking is one batch."""
  framed, labels = [], []
  for i, rng in enumerate(rngs):
    row = {k: v[i] for k, v in rows.items()}
    docs = sentence_pairs.row_documents(row, tokenizer.eos_id)
    others = (None if partners is None else sentence_pairs.row_documents(
        {k: v[i] for k, v in partners.items()}, tokenizer.eos_id))
    a, b, label = sentence_pairs.sentence_pair(docs, length - 3, task, rng, others)
    framed.append(sentence_pairs.frame_pair(a, b, length, cls_id=ids[0], sep_id=ids[1],
                                            pad_id=tokenizer.pad_id))
    labels.append(label)
  stacked = row_store.stack(framed)
  batch = mlm_batch(stacked, rngs, tokenizer, objective, special_ids)
  batch["encoder_token_type_ids"] = stacked["token_types"]
  batch["sentence_labels"] = np.asarray(labels, np.int32)
  return batch


def _prepare(task: str):
  def prepare(tokenizer: Tokenizer, objective: MaskingConfig, data: DataConfig) -> Prepared:
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
    make_batch = lambda rows, rngs, partners=None: pair_batch(
        rows, rngs, task, length, tokenizer, objective, specials, ids, partners)
    return Prepared(
        make_example=one_row(make_batch), make_batch=make_batch,
        lengths={"encoder": length},
        # A window of several pairs, documents ended by EOS (module doc).
        row_length=sentence_pairs.PAIR_WINDOW * (length - 3), eos=True,
        max_predictions=int(np.ceil(objective.mask_rate * length)),
        partner=task == "nsp")  # NSP's random next from the whole corpus
  return prepare


NSP = Objective("mlm_nsp", "encoder", _prepare("nsp"),
                "masked LM + next-sentence prediction (BERT)", config=MaskingConfig,
                model_needs=MODEL_NEEDS, summarize=losses.summarize_sentences)
SOP = Objective("mlm_sop", "encoder", _prepare("sop"),
                "masked LM + sentence-order prediction (ALBERT)", config=MaskingConfig,
                model_needs=MODEL_NEEDS, summarize=losses.summarize_sentences)
