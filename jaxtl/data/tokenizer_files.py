"""Which tokenizer a file or folder holds: one loader for every kind."""

from __future__ import annotations

import os
import shutil

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


def save_tokenizer(tok: Tokenizer, folder: str | os.PathLike[str],
                   sentencepiece_name: str = "") -> str:
  """Writes ``tok`` into ``folder`` so :func:`get_tokenizer` reads it back.

  WordPiece / BPE tokenizers become ``tokenizer.json``; a SentencePiece model
  is copied (as ``sentencepiece_name``, default its own name). The file
  appears whole or not at all (processes may share the folder). Returns its path.
  """
  os.makedirs(folder, exist_ok=True)
  if isinstance(tok, hf_tokenizers.HuggingFaceTokenizer):
    path = os.path.join(folder, "tokenizer.json")
    write = tok.backend.save
  elif isinstance(tok, SentencePieceTokenizer):
    path = os.path.join(folder, sentencepiece_name or os.path.basename(tok.model_path))
    write = lambda dst: shutil.copyfile(tok.model_path, dst)
  else:
    raise TypeError(f"cannot save a {type(tok).__name__}")
  tmp = f"{path}.tmp{os.getpid()}"
  write(tmp)
  os.replace(tmp, path)
  return path
