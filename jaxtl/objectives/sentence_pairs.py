"""Sentence-pair examples from a row of documents: BERT's next-sentence
prediction (NSP) and ALBERT's sentence-order prediction (SOP).

An example is ``[CLS] A [SEP] B [SEP]`` with token types 0 on ``[CLS] A
[SEP]`` and 1 on ``B [SEP]``, MLM-masked as usual, plus one sentence label:

  nsp: 50% B is the segment that follows A in its document (label 0), 50%
       B is a segment of another document (label 1, BERT's "random next").
  sop: A and B are always consecutive segments of one document; 50% they
       come in order (label 0), 50% swapped (label 1) (Lan et al., 2020).

Label 0 means "in order" for both, as Hugging Face's ``BertForPreTraining``
(``next_sentence_label``) and ALBERT's SOP count them.

The objective sees a row at a time (``make_example(row, rng, partner)``, a
pure function, so masks and pairs are dynamic and resumable), so its rows
are cut twice as long as the pair (:data:`PAIR_WINDOW`) with EOS after every
document, and A and B are chosen inside that window. NSP's "random next" B
comes, as in BERT, from another document of the whole corpus: the pipeline
hands the example a second, random row of the split (``partner``), and
documents are told apart by number (:func:`row_documents`), so a document
that spans both rows is never taken for another. Only when the partner row
holds nothing but A's document does B come from another document of A's
window, and when that has none either (a corpus of one document), from
A's own document away from A.
"""

from __future__ import annotations

import numpy as np

from jaxtl.objectives.base import Row

TASKS = ("nsp", "sop")
IN_ORDER, NOT_IN_ORDER = 0, 1  # the sentence labels
PAIR_WINDOW = 2  # rows hold this many pairs' worth of tokens
Documents = dict[int, np.ndarray]  # a document's number -> its tokens in a row


def row_documents(row: Row, eos_id: int) -> Documents:
  """The documents (or their parts) in a row, EOS and padding removed, by
  number.

  A document ends at an EOS (``chunk`` rows: one stream of documents) or
  where the segment id changes (``pack`` rows: one segment per document).
  They are numbered on from ``row["document"]``, the number of the one the
  row starts in (:meth:`jaxtl.data.row_store.RowStore.first_documents`; 0
  when the row has none), so the parts of one document in two rows have
  the same number.
  """
  tokens, seg = np.asarray(row["tokens"]), np.asarray(row["segment_ids"])
  ends = (tokens == eos_id) | np.append(seg[1:] != seg[:-1], True)
  doc_ids = int(row.get("document", 0)) + np.concatenate([[0], np.cumsum(ends[:-1])])
  keep = (seg > 0) & (tokens != eos_id)
  ids, kept = doc_ids[keep], tokens[keep]
  if not ids.size:
    return {}
  # Slices of the kept tokens (np.split's per-piece overhead was most of the
  # host's time per NSP example).
  bounds = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), ids.size]
  return {int(ids[start]): kept[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])}


def _pick(rng: np.random.Generator, sizes: np.ndarray) -> int:
  """An index drawn with probability proportional to ``sizes``."""
  return int(rng.choice(len(sizes), p=sizes / sizes.sum()))


def _piece(rng: np.random.Generator, tokens: np.ndarray, length: int) -> np.ndarray:
  """A random contiguous piece of ``tokens``, at most ``length`` long."""
  length = min(length, tokens.size)
  start = int(rng.integers(0, tokens.size - length + 1))
  return tokens[start:start + length]


def _other_document(rng: np.random.Generator, pools: list[Documents], own: int,
                    length: int) -> np.ndarray | None:
  """A piece of a document other than ``own``, from the first pool that has
  one (documents chosen in proportion to length), or None."""
  for pool in pools:
    others = [tokens for number, tokens in pool.items() if number != own]
    if others:
      sizes = np.array([d.size for d in others], np.float64)
      return _piece(rng, others[_pick(rng, sizes)], length)
  return None


def _not_touching(rng: np.random.Generator, doc: np.ndarray, start: int, stop: int,
                  length: int) -> np.ndarray | None:
  """A piece of ``doc`` outside ``[start, stop]`` (A and the token after it),
  or None when nothing is left there."""
  regions = [doc[:start], doc[stop + 1:]]
  sizes = np.array([r.size for r in regions], np.float64)
  if not sizes.sum():
    return None
  return _piece(rng, regions[_pick(rng, sizes)], length)


def sentence_pair(docs: Documents, budget: int, task: str, rng: np.random.Generator,
                  partner: Documents | None = None
                  ) -> tuple[np.ndarray, np.ndarray, int]:
  """``(A, B, label)`` with ``len(A) + len(B) <= budget`` from a row's documents.

  A and its true continuation are a random piece of one document (chosen in
  proportion to length, so every token is as likely to be used), cut at a
  random point; then ``task`` decides B and the label (module doc). NSP's
  random B comes from ``partner`` (the documents of another row) when it
  holds a document other than A's.
  """
  if task not in TASKS:
    raise ValueError(f"sentence task {task!r}; expected one of {TASKS}")
  if not any(d.size >= 2 for d in docs.values()):  # use the row as one
    docs = ({min(docs): np.concatenate(list(docs.values()))} if docs
            else {0: np.zeros(2, np.int32)})
  numbers = list(docs)
  usable = np.array([d.size if d.size >= 2 else 0 for d in docs.values()], np.float64)
  own = numbers[_pick(rng, usable)]
  doc = docs[own]
  take = min(doc.size, budget)
  start = int(rng.integers(0, doc.size - take + 1))
  cut = int(rng.integers(1, take)) if take >= 2 else 1
  a, b = doc[start:start + cut], doc[start + cut:start + take]
  flip = rng.random() < 0.5
  if not flip:
    return a, b, IN_ORDER
  if task == "sop":
    return b, a, NOT_IN_ORDER
  other = _other_document(rng, [partner or {}, docs], own, take - cut)
  if other is None:  # a corpus of one document
    other = _not_touching(rng, doc, start, start + cut, take - cut)
  # A document of two or three tokens has no such piece: B before A, then.
  return (a, other, NOT_IN_ORDER) if other is not None else (b, a, NOT_IN_ORDER)


def frame_pair(a: np.ndarray, b: np.ndarray, length: int, *, cls_id: int, sep_id: int,
               pad_id: int) -> dict[str, np.ndarray]:
  """``[CLS] A [SEP] B [SEP]`` padded to ``length``: tokens, segment ids (1
  on real tokens), positions and token types (0 for A's part, 1 for B's)."""
  tokens = np.concatenate([[cls_id], a, [sep_id], b, [sep_id]]).astype(np.int32)
  n = tokens.size
  if n > length:
    raise ValueError(f"a pair of {n} tokens does not fit in {length}")
  out = {"tokens": np.full(length, pad_id, np.int32),
         "segment_ids": np.zeros(length, np.int32),
         "positions": np.zeros(length, np.int32),
         "token_types": np.zeros(length, np.int32)}
  out["tokens"][:n] = tokens
  out["segment_ids"][:n] = 1
  out["positions"][:n] = np.arange(n)
  out["token_types"][a.size + 2:n] = 1
  return out
