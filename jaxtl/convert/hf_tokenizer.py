"""An exported model's tokenizer, in files ``transformers.AutoTokenizer`` reads.

A WordPiece / BPE tokenizer is already a ``tokenizer.json``. A SentencePiece
model is not something every Hugging Face class reads: ``T5Tokenizer`` does
(``spiece.model``), ``BertTokenizer`` and ``GPT2Tokenizer`` want files of
their own vocabularies. So the model is also rebuilt as a ``tokenizers``
pipeline that encodes as ``SentencePieceProcessor.encode`` does (its
normalizer, its pieces and scores, user-defined pieces kept whole), framed
as jaxtl frames the model's inputs ([CLS] a [SEP] for BERT, a </s> for T5),
and saved as ``tokenizer.json`` with a ``tokenizer_config.json`` naming the
generic fast class and the special tokens. One difference is left: a text
that spells a control piece (``<unk>``, ``</s>``) is that piece there, where
SentencePiece reads its characters (WikiText's literal ``<unk>``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Sequence

import tokenizers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from jaxtl.data.tokenizer_files import save_tokenizer
from jaxtl.data.tokenizers import SentencePieceTokenizer, Tokenizer

_NORMAL, _USER_DEFINED, _UNUSED = 1, 4, 5  # ModelProto.SentencePiece.Type
_UNIGRAM, _BPE = 1, 2  # TrainerSpec.ModelType
_SPACE = "\u2581"  # SentencePiece's visible space
Frame = tuple[Sequence[int], Sequence[int], Sequence[int]]


def save(tok: Tokenizer, folder: str, frame: Frame | None, token_types: bool = False,
         own_model_type: bool = False) -> None:
  """Writes ``tok`` into the export ``folder``; a SentencePiece model's
  ``tokenizer.json`` puts ``frame``'s ids (prefix, separator, suffix: what
  :func:`jaxtl.tasks.features.frame` gives the model's inputs) around each
  text, or nothing where ``frame`` is None (a language model's prompt ends
  where its text does); with ``token_types`` (a model with a token type
  table: BERT's) it gives the model ``token_type_ids`` too.

  A ``tokenizers`` tokenizer (WordPiece, BPE) is its ``tokenizer.json``,
  whose class and special tokens ``transformers`` takes from the folder's
  ``model_type``; under jaxtl's own (``own_model_type``: a head in
  ``modeling_jaxtl.py``) there is no such class, and a
  ``tokenizer_config.json`` names them instead."""
  if not isinstance(tok, SentencePieceTokenizer):
    save_tokenizer(tok, folder)
    if own_model_type:
      _write_config(tok, folder, tok.backend.id_to_token, token_types, split_special=False)
    return
  save_tokenizer(tok, folder, sentencepiece_name="spiece.model")  # T5Tokenizer's
  fast = from_sentencepiece(tok)
  if frame is not None:
    fast.post_processor = _template(tok, frame)
  fast.save(os.path.join(folder, "tokenizer.json"))
  # The special tokens' text is read by tokenizer.json as SentencePiece
  # reads it (user-defined pieces whole, a space before one kept), not cut
  # out of the text first: a [MASK] written in a text is the [MASK] piece.
  _write_config(tok, folder, fast.id_to_token, token_types, split_special=True)


def _write_config(tok: Tokenizer, folder: str, id_to_token: Callable[[int], str],
                  token_types: bool, split_special: bool) -> None:
  """``tokenizer_config.json``: the generic fast class and ``tok``'s special
  tokens by name; ``split_special``: their text in a text is read as the
  tokenizer reads any text (else it is the special token)."""
  names = {"pad_token": tok.pad_id, "eos_token": tok.eos_id, "unk_token": tok.unk_id,
           "bos_token": tok.bos_id, "mask_token": tok.mask_id, "cls_token": tok.cls_id,
           "sep_token": tok.sep_id}
  config = {"tokenizer_class": "PreTrainedTokenizerFast",
            **({"split_special_tokens": True} if split_special else {}),
            "model_input_names": ["input_ids", *(["token_type_ids"] if token_types else []),
                                  "attention_mask"],
            **{name: id_to_token(i) for name, i in names.items() if i is not None}}
  with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2)


def from_sentencepiece(tok: SentencePieceTokenizer) -> tokenizers.Tokenizer:
  """The SentencePiece model of ``tok`` as a ``tokenizers`` pipeline that
  gives the same ids (no special tokens added)."""
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tok.processor.serialized_model_proto())
  spec, norm, pieces = proto.trainer_spec, proto.normalizer_spec, proto.pieces
  user = [p.piece for p in pieces if p.type == _USER_DEFINED]
  # SentencePiece never emits an unused piece (T5's rare characters): named
  # with a space, which the normalized text never holds, none matches.
  names = [f"<unused {i}>" if p.type == _UNUSED else p.piece for i, p in enumerate(pieces)]
  # The processor's unk id (tok.unk_id): a trainer spec may name another, as one of T5's does.
  if spec.model_type == _UNIGRAM:
    model = tokenizers.models.Unigram([(n, p.score) for n, p in zip(names, pieces)],
                                      unk_id=tok.unk_id, byte_fallback=spec.byte_fallback)
  elif spec.model_type == _BPE:
    model = tokenizers.models.BPE(
        {n: i for i, n in enumerate(names)}, _merges(pieces),
        unk_token=names[tok.unk_id], fuse_unk=True, byte_fallback=spec.byte_fallback,
        ignore_merges=bool(user))
  else:
    raise ValueError(f"{tok.model_path}: a SentencePiece model of type "
                     f"{spec.model_type} (word or char) has no tokenizer.json form; "
                     "only unigram and bpe models do")
  fast = tokenizers.Tokenizer(model)
  # T5's sentinels above its pieces (<extra_id_0> is the last id), as
  # T5Tokenizer adds them.
  above = sorted((tok.sentinel_id(i), i) for i in range(tok.num_sentinels)
                 if tok.sentinel_id(i) >= len(pieces))
  fast.add_special_tokens([tokenizers.AddedToken(f"<extra_id_{i}>", normalized=False)
                           for _, i in above])
  # The normalizer in SentencePiece's order: its character map, then spaces
  # (only spaces: line breaks stay), then spaces made visible.
  steps = []
  if norm.precompiled_charsmap:
    steps.append(normalizers.Precompiled(norm.precompiled_charsmap))
  if norm.remove_extra_whitespaces:
    steps += [normalizers.Replace(tokenizers.Regex(r"\A +| +\z"), ""),
              normalizers.Replace(tokenizers.Regex(" {2,}"), " ")]
  if norm.escape_whitespaces:
    steps.append(normalizers.Replace(" ", _SPACE))
  fast.normalizer = normalizers.Sequence(steps)
  # The dummy prefix before the text's first piece; user-defined pieces
  # (jaxtl's [MASK], sentinels, line breaks) are always whole pieces.
  splits = []
  if norm.add_dummy_prefix:
    splits.append(pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="always",
                                           split=False))
  if user:
    pattern = "|".join(re.escape(p) for p in sorted(user, key=len, reverse=True))
    splits.append(pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"))
  if splits:
    fast.pre_tokenizer = pre_tokenizers.Sequence(splits)
  back = [decoders.Replace(_SPACE, " ")]
  if spec.byte_fallback:
    back.append(decoders.ByteFallback())
  back.append(decoders.Fuse())
  if norm.add_dummy_prefix:
    back.append(decoders.Strip(content=" ", left=1, right=0))
  fast.decoder = decoders.Sequence(back)
  return fast


def _merges(pieces) -> list[tuple[str, str]]:
  """BPE merges from the pieces' scores: a normal piece made of two normal
  pieces is their merge, ranked by its score (SentencePiece's own order)."""
  normal = {p.piece: (p.score, i) for i, p in enumerate(pieces) if p.type == _NORMAL}
  ranked = sorted((-score, i, piece[:k], piece[k:])
                  for piece, (score, i) in normal.items() for k in range(1, len(piece))
                  if piece[:k] in normal and piece[k:] in normal)
  return [(left, right) for _, _, left, right in ranked]


def _template(tok: SentencePieceTokenizer, frame: Frame) -> processors.PostProcessor:
  """``frame`` (prefix, separator, suffix ids) around one text or a pair,
  the pair's second text and what follows it of token type 1."""
  prefix, sep, suffix = ([tok.processor.id_to_piece(i) for i in ids] for ids in frame)
  single = [*prefix, "$A", *suffix]
  pair = [*prefix, "$A", *sep, "$B:1", *(f"{p}:1" for p in suffix)]
  specials = {i for ids in frame for i in ids}
  return processors.TemplateProcessing(
      single=single, pair=pair,
      special_tokens=[(tok.processor.id_to_piece(i), i) for i in sorted(specials)])
