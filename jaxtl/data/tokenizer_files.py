"""Which tokenizer a file or folder holds: one loader for every kind."""

from __future__ import annotations

import glob
import os
import shutil

from jaxtl import layout
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


def workdir_tokenizer(workdir: str) -> Tokenizer:
  """The tokenizer a pretraining run trained (or loaded) into its workdir."""
  folder = layout.tokenizer_dir(workdir)
  models = sorted(glob.glob(os.path.join(folder, "*.model")))
  if len(models) > 1:  # never taken by guess: ids of another vocabulary are garbage
    raise ValueError(f"{folder} holds {len(models)} tokenizers "
                     f"({', '.join(map(os.path.basename, models))}): keep the one the "
                     "run was trained with, or set config.tokenizer_path")
  if models:
    return get_tokenizer(models[0])
  if os.path.isfile(os.path.join(folder, "tokenizer.json")):
    return get_tokenizer(folder)
  raise FileNotFoundError(f"no tokenizer in {folder}; set config.tokenizer_path")


def keep_tokenizer(tok: Tokenizer, workdir: str | None) -> Tokenizer:
  """Copies a given tokenizer into the workdir: it travels with the
  checkpoints, so fine-tuning (or continuing) the run finds it."""
  if workdir is not None:
    save_tokenizer(tok, layout.tokenizer_dir(workdir))
  return tok
