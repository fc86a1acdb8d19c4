"""Training a SentencePiece model with jaxtl's special ids
(:func:`train_sentencepiece`): paragraphs cut to SentencePiece's sentence
limit, a seeded sample of them, deterministic training, and the model and
vocab files written whole. The tokenizer it gives is
:class:`jaxtl.data.tokenizers.SentencePieceTokenizer`.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Iterable, Iterator

import sentencepiece as spm

from jaxtl.data.tokenizers import (CLS_PIECE, KEPT_WHITESPACE, MASK_PIECE, SEP_PIECE,
                                   SentencePieceTokenizer)

_LOG = logging.getLogger(__name__)

# SentencePiece's default max_sentence_length, in bytes.
_MAX_SENTENCE_BYTES = 4192
# Where a text's paragraphs end: the units a tokenizer is trained on.
_BLANK_LINE = re.compile(r"\n\s*\n")
# Fixed thread count for training: unigram scores depend on how the work is
# split among threads, so a machine-dependent count would break determinism.
_TRAIN_THREADS = 16


def _utf8_len(text: str) -> int:
  return len(text.encode("utf-8"))


def _cut_characters(text: str, max_bytes: int) -> Iterator[str]:
  """Cuts `text` between characters into chunks of at most `max_bytes`."""
  data = text.encode("utf-8")
  start = 0
  while start < len(data):
    end = min(start + max_bytes, len(data))
    while end < len(data) and data[end] & 0xC0 == 0x80:
      end -= 1  # Never cut inside a multi-byte character.
    yield data[start:end].decode("utf-8")
    start = end


def _cut(text: str, max_bytes: int, separators: str = "\n ") -> Iterator[str]:
  """Cuts `text` into chunks of at most `max_bytes` UTF-8 bytes: between
  lines where it can, else between words, else between characters."""
  if len(text) * 4 <= max_bytes or _utf8_len(text) <= max_bytes:
    yield text
    return
  if not separators:
    yield from _cut_characters(text, max_bytes)
    return
  sep = separators[0]
  chunk: list[str] = []
  size = 0
  for part in text.split(sep):
    n = _utf8_len(part)
    if chunk and size + 1 + n > max_bytes:
      yield sep.join(chunk)
      chunk, size = [], 0
    if n > max_bytes:
      yield from _cut(part, max_bytes, separators[1:])
      continue
    size += n + (1 if chunk else 0)
    chunk.append(part)
  if chunk:
    yield sep.join(chunk)


def _training_sentences(texts: Iterable[str], max_bytes: int
                        ) -> Iterator[str]:
  """Yields the paragraphs of `texts`, cut to fit SentencePiece's limit.

  A paragraph (text between blank lines) keeps its line breaks: the model
  must see the words that start a line, which carry no U+2581, as they are
  encoded later. A one-line document (WikiText's) is one paragraph.
  """
  for text in texts:
    for paragraph in _BLANK_LINE.split(text):
      for sentence in _cut(paragraph.strip(), max_bytes):
        if sentence := sentence.strip():
          yield sentence


def _sample_sentences(sentences: Iterable[str], max_sentences: int,
                      seed: int) -> list[str]:
  """Keeps all sentences, or a seeded uniform sample of `max_sentences`."""
  rng = random.Random(seed)
  kept: list[str] = []
  seen = 0
  for s in sentences:
    seen += 1
    if len(kept) < max_sentences:
      kept.append(s)
    else:  # Reservoir sampling: deterministic given the seed.
      j = rng.randrange(seen)
      if j < max_sentences:
        kept[j] = s
  if seen > max_sentences:
    _LOG.info("sentencepiece: sampled %d of %d sentences", max_sentences,
              seen)
  return kept


class _ModelWriter:
  """Receives the serialized model from SentencePiece's trainer."""

  def __init__(self):
    self.data = b""

  def write(self, data: bytes) -> None:
    self.data = data


def _write_atomically(path: str, data: bytes) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


class VocabTooLarge(ValueError):
  """The training text has fewer distinct pieces than the vocabulary asked
  for; ``most`` is the largest size SentencePiece can make of it."""

  def __init__(self, message: str, most: int):
    super().__init__(message)
    self.most = most


def train_sentencepiece(
    texts: Iterable[str],
    model_prefix: str | os.PathLike[str],
    vocab_size: int,
    model_type: str = "unigram",
    num_sentinels: int = 100,
    max_sentences: int = 2_000_000,
    character_coverage: float = 0.9995,
    seed: int = 0,
) -> SentencePieceTokenizer:
  """Trains a SentencePiece model on `texts` with jaxtl's special ids.

  Ids: pad=0, eos=1, unk=2, bos=3, then user-defined `[MASK]`, `[CLS]`,
  `[SEP]`, `<extra_id_0>`..`<extra_id_{num_sentinels-1}>` and the line
  break and tab pieces (`KEPT_WHITESPACE`). The result has exactly
  `vocab_size` pieces, specials included (SentencePiece's hard vocab limit
  is kept, so a corpus too small for the size is an error rather than a
  silently smaller vocabulary).

  Decoding gives back the text's line breaks and tabs: the normalizer is
  NFKC without nmt_nfkc's folding of them into spaces. Runs of spaces still
  become one, and a text's leading and trailing spaces go: keeping them
  would cost WikiText, whose lines start and end with a space, two pieces a
  line. Texts are split into paragraphs at blank lines, their line breaks
  kept, and paragraphs longer than SentencePiece's 4192-byte sentence limit
  are cut between lines, then words. Training is deterministic: input order
  is kept (a seeded reservoir sample when there are more than
  `max_sentences` paragraphs) and the thread count is fixed.

  Args:
    texts: Documents to learn from.
    model_prefix: Writes `{model_prefix}.model` and `{model_prefix}.vocab`.
    vocab_size: Total number of pieces.
    model_type: "unigram" or "bpe".
    num_sentinels: Number of T5 sentinel pieces to reserve.
    max_sentences: Cap on training paragraphs.
    character_coverage: Fraction of characters the vocabulary must cover.
    seed: Seed for the sentence sample and SentencePiece's own randomness.

  Returns:
    The trained tokenizer, loaded from `{model_prefix}.model`.
  """
  if model_type not in ("unigram", "bpe"):
    raise ValueError(
        f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
  if num_sentinels < 0 or max_sentences <= 0:
    raise ValueError("num_sentinels must be >= 0 and max_sentences > 0, got "
                     f"{num_sentinels} and {max_sentences}")
  symbols = [MASK_PIECE, CLS_PIECE, SEP_PIECE] + [
      f"<extra_id_{i}>" for i in range(num_sentinels)] + list(KEPT_WHITESPACE)
  reserved = 4 + len(symbols)
  if vocab_size <= reserved:
    raise ValueError(
        f"vocab_size={vocab_size} leaves no room for text pieces: {reserved} "
        "ids are reserved for special tokens")
  prefix = os.fspath(model_prefix)
  sentences = _sample_sentences(
      _training_sentences(texts, _MAX_SENTENCE_BYTES), max_sentences, seed)
  if not sentences:
    raise ValueError(f"no non-empty text to train {prefix}.model on")

  writer = _ModelWriter()
  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=writer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=0, eos_id=1, unk_id=2, bos_id=3,
        pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        bos_piece="<s>",
        user_defined_symbols=symbols,
        # nmt_nfkc would turn line breaks into spaces while training, so the
        # words that start a line would get no pieces of their own.
        normalization_rule_name="nfkc",
        remove_extra_whitespaces=True,
        hard_vocab_limit=True,
        input_sentence_size=0,  # We already sampled.
        shuffle_input_sentence=False,
        max_sentence_length=_MAX_SENTENCE_BYTES,
        num_threads=_TRAIN_THREADS,
        minloglevel=1,
    )
  except RuntimeError as e:
    most = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= "
                     r"(\d+)", str(e))
    if most:
      raise VocabTooLarge(
          f"{prefix}.model: the training text ({len(sentences)} "
          f"sentence{'s' if len(sentences) != 1 else ''}) gives at most {most.group(1)} "
          f"pieces, not the {vocab_size} asked", int(most.group(1))
      ) from e
    raise ValueError(
        f"SentencePiece training of {prefix}.model failed (vocab_size="
        f"{vocab_size}, model_type={model_type!r}, {len(sentences)} "
        f"sentences): {e}") from e

  # Write the files ourselves, each via a temp file + rename, so readers
  # never see a half-written model.
  directory = os.path.dirname(prefix)
  if directory:
    os.makedirs(directory, exist_ok=True)
  sp = spm.SentencePieceProcessor(model_proto=writer.data)
  # One line a piece: the line break and tab pieces are written escaped.
  escape = str.maketrans({"\n": "\\n", "\t": "\\t"})
  vocab_lines = [
      f"{sp.id_to_piece(i).translate(escape)}\t{sp.get_score(i):g}\n"
      for i in range(sp.get_piece_size())]
  _write_atomically(f"{prefix}.vocab", "".join(vocab_lines).encode("utf-8"))
  _write_atomically(f"{prefix}.model", writer.data)
  return SentencePieceTokenizer(f"{prefix}.model")
