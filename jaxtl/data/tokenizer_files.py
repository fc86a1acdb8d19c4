"""Which tokenizer a file or folder holds: one loader for every kind."""

from __future__ import annotations

import os

from jaxtl.data import hf_tokenizers
from jaxtl.data.tokenizers import SentencePieceTokenizer, Tokenizer


def get_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
  """Loads the tokenizer at `path`, choosing the class by file name.

  SentencePiece ``.model``; WordPiece ``vocab.txt``; byte-level BPE
  ``*vocab.json`` (with ``*merges.txt`` beside it); ``tokenizer.json``; or a
  Hugging Face model folder holding one of them (or T5's ``spiece.model``).
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"tokenizer not found: {path}")
  if path.endswith(".model"):
    return SentencePieceTokenizer(path)
  tok = hf_tokenizers.load(path)
  if tok is not None:
    return tok
  if os.path.isfile(os.path.join(path, "spiece.model")):
    return SentencePieceTokenizer(os.path.join(path, "spiece.model"))
  raise ValueError(
      f"unsupported tokenizer {path!r}: expected a SentencePiece .model, "
      "vocab.txt, *vocab.json + *merges.txt, tokenizer.json, or a folder "
      "holding one")
