"""Tokenizers behind one interface, so models and pipelines never care which.

Every tokenizer exposes the ids that the data pipeline needs (pad, eos, the
MLM mask, T5 sentinels, ...) and the set of ids that must never be chosen
for masking. SentencePiece lives here (trained by
:mod:`jaxtl.data.sentencepiece_training`); WordPiece and byte-level BPE,
through the `tokenizers` library, in :mod:`jaxtl.data.hf_tokenizers`;
:func:`jaxtl.data.tokenizer_files.get_tokenizer` picks by file name.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

_LOG = logging.getLogger(__name__)

# Pieces by which special tokens are recognised in a SentencePiece model.
MASK_PIECE = "[MASK]"
WORD_START = "\u2581"  # SentencePiece's mark of a piece that follows a space
CLS_PIECE = "[CLS]"
SEP_PIECE = "[SEP]"
_SENTINEL_RE = re.compile(r"^(?:\u2581)?<extra_id_(\d+)>$")

# Classic T5 models hold 32000 pieces; the 100 sentinels live after them,
# outside the SentencePiece model, counting down from the top of the vocab.
_T5_PIECES = 32000
_T5_SENTINELS = 100

# Whitespace a jaxtl-trained model keeps as pieces of their own, so a text
# keeps its lines (verse, a play's speeches) and tabs: SentencePiece's
# default normalizer (nmt_nfkc) turns both into spaces, and a model trained
# on Shakespeare then writes one endless line.
KEPT_WHITESPACE = ("\n", "\t")


class Tokenizer(abc.ABC):
  """Text <-> ids, with the special ids the data pipeline relies on.

  Attributes:
    vocab_size: Size of the id space the model's embedding must cover (may
      exceed the number of real pieces, e.g. T5's out-of-model sentinels).
    pad_id, eos_id, unk_id: Always present.
    bos_id, mask_id, cls_id, sep_id: None when the vocabulary has no such
      token.
  """

  vocab_size: int
  pad_id: int
  eos_id: int
  unk_id: int
  bos_id: int | None = None
  mask_id: int | None = None
  cls_id: int | None = None
  sep_id: int | None = None
  # Sentinel ids in order (index i is <extra_id_i>); set by subclasses.
  _sentinels: tuple[int, ...] = ()

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Returns the ids of `text`, without bos/eos."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    """Returns the text of `ids`, skipping padding."""

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Encodes many texts; subclasses override this with a faster path."""
    return [self.encode(t) for t in texts]

  def encode_with_offsets(self, text: str
                          ) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids plus each id's ``(start, end)`` character span in ``text``.

    Spans exclude the whitespace a piece absorbs, so ``text[start:end]`` is
    the visible text of the piece; extractive QA maps answers through them.
    """
    raise NotImplementedError(
        f"{type(self).__name__} does not report character offsets")

  @abc.abstractmethod
  def fingerprint(self) -> str:
    """A short hash of the vocabulary: keys caches of tokenized data."""

  @property
  def num_sentinels(self) -> int:
    """Number of T5 sentinels (<extra_id_i>) the vocabulary provides."""
    return len(self._sentinels)

  def sentinel_id(self, i: int) -> int:
    """Returns the id of T5 sentinel <extra_id_i>, for span corruption."""
    if not 0 <= i < len(self._sentinels):
      raise ValueError(
          f"sentinel <extra_id_{i}> is not in this vocabulary (it has "
          f"{len(self._sentinels)} sentinels)")
    return self._sentinels[i]

  def _extra_special_ids(self) -> Iterable[int]:
    """Other ids that are special for a given implementation."""
    return ()

  @functools.cached_property
  def word_starts(self) -> np.ndarray:
    """[vocab_size] bool: whether each id begins a word, computed once from
    the vocabulary, for whole-word masking (special ids count as starts: a
    word never runs across one).
    """
    table = np.asarray(self._word_start_table(), dtype=bool).copy()
    table[self.special_ids] = True
    return table

  def _word_start_table(self) -> np.ndarray:
    """Per id, whether its piece starts a word; subclasses read their vocab."""
    raise NotImplementedError(f"{type(self).__name__} cannot tell where words "
                              "start (config.objective.whole_word)")

  @property
  def special_ids(self) -> np.ndarray:
    """Sorted int32 ids of all special tokens, so masking can avoid them."""
    ids = {self.pad_id, self.eos_id, self.unk_id}
    for i in (self.bos_id, self.mask_id, self.cls_id, self.sep_id):
      if i is not None:
        ids.add(i)
    ids.update(self._sentinels)
    ids.update(self._extra_special_ids())
    return np.array(sorted(ids), dtype=np.int32)


def _optional_id(i: int) -> int | None:
  return None if i < 0 else i


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece `.model` file (T5's vocabulary, or one we trained)."""

  def __init__(self, model_path: str | os.PathLike[str],
               num_threads: int = -1):
    """Loads the model.

    Args:
      model_path: Path of a SentencePiece `.model` file.
      num_threads: Threads for `encode_batch`; -1 lets SentencePiece decide.
    """
    self.model_path = os.fspath(model_path)
    if not os.path.isfile(self.model_path):
      raise FileNotFoundError(
          f"SentencePiece model not found: {self.model_path}")
    self._sp = spm.SentencePieceProcessor(model_file=self.model_path)
    self._num_threads = num_threads
    sp = self._sp
    self._num_pieces = sp.get_piece_size()

    unk = sp.unk_id()
    pad = _optional_id(sp.pad_id())
    eos = _optional_id(sp.eos_id())
    if pad is None or eos is None or unk < 0:
      raise ValueError(
          f"{self.model_path}: a model needs pad, eos and unk ids (got pad="
          f"{sp.pad_id()}, eos={sp.eos_id()}, unk={unk})")
    self.pad_id, self.eos_id, self.unk_id = pad, eos, unk
    self.bos_id = _optional_id(sp.bos_id())

    # One pass over the pieces finds named specials and sentinels; looking
    # them up with piece_to_id would silently return unk for absent ones.
    named: dict[str, int] = {}
    sentinels: dict[int, int] = {}
    controls: list[int] = []
    pieces = sp.id_to_piece(list(range(self._num_pieces)))
    for i, piece in enumerate(pieces):
      if piece in (MASK_PIECE, CLS_PIECE, SEP_PIECE):
        named.setdefault(piece, i)
      elif piece.endswith(">") and (m := _SENTINEL_RE.match(piece)):
        sentinels.setdefault(int(m.group(1)), i)
      if sp.is_control(i):
        controls.append(i)
    self.mask_id = named.get(MASK_PIECE)
    self.cls_id = named.get(CLS_PIECE)
    self.sep_id = named.get(SEP_PIECE)
    self._controls = tuple(controls)

    self.vocab_size = self._num_pieces
    self._virtual_sentinels = False
    if sentinels:
      # Sentinels must be numbered 0..n-1; keep the contiguous prefix.
      n = 0
      while n in sentinels:
        n += 1
      if n != len(sentinels):
        _LOG.warning("%s: sentinel pieces are not numbered contiguously; "
                     "using <extra_id_0>..<extra_id_%d>", self.model_path,
                     n - 1)
      self._sentinels = tuple(sentinels[i] for i in range(n))
    elif self._num_pieces == _T5_PIECES:
      # Classic T5 convention: sentinels sit above the model's pieces.
      self.vocab_size = _T5_PIECES + _T5_SENTINELS
      self._sentinels = tuple(
          self.vocab_size - 1 - i for i in range(_T5_SENTINELS))
      self._virtual_sentinels = True
    else:
      self._sentinels = ()

  def __repr__(self) -> str:
    return (f"SentencePieceTokenizer({self.model_path!r}, "
            f"vocab_size={self.vocab_size})")

  @property
  def processor(self) -> spm.SentencePieceProcessor:
    """The underlying SentencePiece processor, for anything not wrapped."""
    return self._sp

  def fingerprint(self) -> str:
    return hashlib.sha1(self._sp.serialized_model_proto()).hexdigest()[:16]

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Encodes `texts` in SentencePiece's multi-threaded C++ loop."""
    return self._sp.encode(list(texts), num_threads=self._num_threads)

  def encode_with_offsets(self, text: str
                          ) -> tuple[list[int], list[tuple[int, int]]]:
    pieces = self._sp.encode(text, return_type="proto").pieces
    # SentencePiece reports UTF-8 byte offsets; map them to characters.
    char_at = np.zeros(len(text.encode("utf-8")) + 1, np.int64)
    char_at[np.cumsum([len(ch.encode("utf-8")) for ch in text])] = 1
    char_at = np.cumsum(char_at)
    ids, spans = [], []
    for p in pieces:
      start, end = int(char_at[p.begin]), int(char_at[p.end])
      while start < end and text[start].isspace():
        start += 1
      ids.append(p.id)
      spans.append((start, end))
    return ids, spans

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids if int(i) != self.pad_id]
    if not self._virtual_sentinels or all(i < self._num_pieces for i in ids):
      return self._sp.decode(ids)
    # Out-of-model T5 sentinels: decode the runs between them separately.
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
      if i < self._num_pieces:
        run.append(i)
        continue
      if run:
        parts.append(self._sp.decode(run))
        run = []
      parts.append(f"<extra_id_{self.vocab_size - 1 - i}>")
    if run:
      parts.append(self._sp.decode(run))
    return " ".join(p for p in parts if p)

  def _extra_special_ids(self) -> Iterable[int]:
    return self._controls

  def _word_start_table(self) -> np.ndarray:
    # SentencePiece marks the pieces that follow a space with U+2581; a line
    # break or tab piece begins a word as a space would (the word after it
    # has no U+2581). Ids past its pieces (T5's virtual sentinels) are
    # special anyway.
    table = np.ones(self.vocab_size, dtype=bool)
    pieces = self._sp.id_to_piece(list(range(self._num_pieces)))
    table[:self._num_pieces] = [p.startswith((WORD_START, *KEPT_WHITESPACE))
                                for p in pieces]
    return table
