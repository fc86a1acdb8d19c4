"""WordPiece (BERT) and byte-level BPE (GPT-2) through the `tokenizers` library.

The same :class:`jaxtl.data.tokenizers.Tokenizer` interface as SentencePiece:
ids without special tokens (the task-feature code frames them as
``[CLS] a [SEP] b [SEP]`` or ``a </s>``), the special ids the pipelines need,
character offsets for extractive QA, a fingerprint for caches. The Rust
library does the work, so ids equal ``transformers``' fast tokenizers'.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence

import numpy as np
import tokenizers
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

from jaxtl.data.tokenizers import Tokenizer

_SENTINEL = re.compile(r"^<extra_id_(\d+)>$")
# Candidate token strings for each special role, most specific first.
_ROLES = {
    "pad_id": ("[PAD]", "<pad>", "<|endoftext|>"),
    "unk_id": ("[UNK]", "<unk>", "<|endoftext|>"),
    "eos_id": ("</s>", "<|endoftext|>", "[SEP]"),
    "bos_id": ("<s>", "<|endoftext|>"),
    "mask_id": ("[MASK]", "<mask>"),
    "cls_id": ("[CLS]",),
    "sep_id": ("[SEP]",),
}


class HuggingFaceTokenizer(Tokenizer):
  """A ``tokenizers.Tokenizer`` behind jaxtl's interface.

  Build one with :meth:`wordpiece`, :meth:`byte_level_bpe` or
  :meth:`from_json` (a ``tokenizer.json``), or let
  :func:`jaxtl.data.tokenizer_files.get_tokenizer` pick from a path. BERT has no
  end-of-sequence token, so its ``eos_id`` is ``[SEP]``; GPT-2 has only
  ``<|endoftext|>``, which serves as bos, eos, unk and pad.
  """

  def __init__(self, tokenizer: tokenizers.Tokenizer, source: str):
    self._tok = tokenizer
    self.source = source
    # Model inputs are never cut or padded here: the pipelines do both.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    for role, candidates in _ROLES.items():
      found = [tokenizer.token_to_id(c) for c in candidates]
      setattr(self, role, next((i for i in found if i is not None), None))
    # T5's tokenizer.json carries its span-corruption sentinels as added tokens.
    sentinels = {int(m.group(1)): i for t, i in tokenizer.get_vocab(True).items()
                 if (m := _SENTINEL.match(t))}
    self._sentinels = tuple(sentinels[k] for k in sorted(sentinels))
    missing = [r for r in ("pad_id", "unk_id", "eos_id") if getattr(self, r) is None]
    if missing:
      raise ValueError(f"{source}: no token for {missing} (looked for "
                       f"{[_ROLES[r] for r in missing]})")

  @classmethod
  def wordpiece(cls, vocab_txt: str | os.PathLike, lowercase: bool = True
                ) -> "HuggingFaceTokenizer":
    """BERT's WordPiece from ``vocab.txt`` (uncased models lower-case)."""
    path = _existing(vocab_txt)
    try:
      impl = BertWordPieceTokenizer(path, lowercase=lowercase)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{path}: not a usable WordPiece vocabulary ({e})") from e
    return cls(impl._tokenizer, path)  # pylint: disable=protected-access

  @classmethod
  def byte_level_bpe(cls, vocab_json: str | os.PathLike, merges_txt: str | os.PathLike
                     ) -> "HuggingFaceTokenizer":
    """GPT-2's byte-level BPE from ``vocab.json`` + ``merges.txt``."""
    vocab, merges = _existing(vocab_json), _existing(merges_txt)
    impl = ByteLevelBPETokenizer(vocab, merges, add_prefix_space=False)
    # As in GPT-2's own tokenizer, the text "<|endoftext|>" is that token.
    impl.add_special_tokens(["<|endoftext|>"])
    return cls(impl._tokenizer, vocab)  # pylint: disable=protected-access

  @classmethod
  def from_json(cls, tokenizer_json: str | os.PathLike) -> "HuggingFaceTokenizer":
    """Any serialized ``tokenizer.json`` (what ``transformers`` saves)."""
    path = _existing(tokenizer_json)
    return cls(tokenizers.Tokenizer.from_file(path), path)

  def __repr__(self) -> str:
    return f"HuggingFaceTokenizer({self.source!r}, vocab_size={self.vocab_size})"

  @property
  def backend(self) -> tokenizers.Tokenizer:
    """The underlying ``tokenizers.Tokenizer``, for anything not wrapped."""
    return self._tok

  def fingerprint(self) -> str:
    return hashlib.sha256(self._tok.to_str().encode()).hexdigest()[:16]

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def encode_with_offsets(self, text: str
                          ) -> tuple[list[int], list[tuple[int, int]]]:
    enc = self._tok.encode(text, add_special_tokens=False)
    spans = []
    for start, end in enc.offsets:  # byte-level pieces carry their leading space
      while start < end and text[start].isspace():
        start += 1
      spans.append((start, end))
    return enc.ids, spans

  def decode(self, ids: Sequence[int]) -> str:
    """The text of ``ids``, special tokens (padding included) left out."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def _word_start_table(self) -> np.ndarray:
    # WordPiece marks continuations (BERT's "##"); byte-level BPE (GPT-2's
    # "\u0120") and SentencePiece-style models ("\u2581") mark word starts.
    model = self._tok.model
    if isinstance(model, tokenizers.models.WordPiece):
      prefix = model.continuing_subword_prefix
      starts = lambda piece: not piece.startswith(prefix)
    else:
      starts = lambda piece: piece.startswith(("\u0120", "\u2581"))
    table = np.ones(self.vocab_size, dtype=bool)
    for piece, i in self._tok.get_vocab(with_added_tokens=True).items():
      if i < self.vocab_size:
        table[i] = starts(piece)
    return table


def _existing(path: str | os.PathLike) -> str:
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"tokenizer file not found: {path}")
  return path


def load(path: str) -> HuggingFaceTokenizer | None:
  """The tokenizer a file or Hugging Face folder holds, or None if not ours.

  ``tokenizer.json`` wins; then ``vocab.txt`` (WordPiece, lower-cased unless
  ``tokenizer_config.json`` beside it says ``do_lower_case: false``); then
  ``*vocab.json`` with the ``*merges.txt`` beside it (byte-level BPE).
  """
  if os.path.isdir(path):
    for name in ("tokenizer.json", "vocab.txt", "vocab.json"):
      if os.path.isfile(os.path.join(path, name)):
        return load(os.path.join(path, name))
    return None
  folder, name = os.path.split(path)
  if name.endswith("tokenizer.json"):
    return HuggingFaceTokenizer.from_json(path)
  if name.endswith("vocab.txt"):
    lowercase = True
    config = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config):
      with open(config, encoding="utf-8") as f:
        lowercase = json.load(f).get("do_lower_case", True)
    return HuggingFaceTokenizer.wordpiece(path, lowercase=lowercase)
  if name.endswith("vocab.json"):
    merges = os.path.join(folder, name[:-len("vocab.json")] + "merges.txt")
    return HuggingFaceTokenizer.byte_level_bpe(path, merges)
  return None
