"""Tests for jaxtl.data.tokenizers: trained and real SentencePiece models."""

from __future__ import annotations

import numpy as np
import pytest

import datadir
from jaxtl.data import sentencepiece_training, tokenizer_files, tokenizers

T5_MODEL = ("tokenizers", "t5_c4_32k_100extra.spm.model")


@pytest.fixture(scope="module")
def shakespeare_lines() -> list[str]:
  path = datadir.require_data("tiny_shakespeare", "input.txt")
  lines = [l.strip() for l in path.read_text("utf-8").splitlines()]
  return [l for l in lines if l][:600]


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def trained(request, shakespeare_lines, tmp_path_factory):
  prefix = tmp_path_factory.mktemp(request.param) / "spm"
  tok = sentencepiece_training.train_sentencepiece(
      shakespeare_lines, prefix, vocab_size=400, model_type=request.param,
      num_sentinels=100)
  return tok, prefix


def test_trained_files_and_exact_vocab_size(trained):
  tok, prefix = trained
  assert prefix.with_suffix(".model").is_file()
  vocab = prefix.with_suffix(".vocab").read_text("utf-8").splitlines()
  assert len(vocab) == 400
  assert tok.vocab_size == 400
  assert tok.processor.get_piece_size() == 400
  assert not list(prefix.parent.glob("*.tmp*"))


def test_trained_special_ids(trained):
  tok, _ = trained
  assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.bos_id) == (0, 1, 2, 3)
  named = [tok.mask_id, tok.cls_id, tok.sep_id]
  assert None not in named
  assert [tok.processor.id_to_piece(i) for i in named] == [
      "[MASK]", "[CLS]", "[SEP]"]
  ids = [tok.pad_id, tok.eos_id, tok.unk_id, tok.bos_id] + named
  assert len(set(ids)) == len(ids)


def test_trained_sentinels(trained):
  tok, _ = trained
  assert tok.num_sentinels == 100
  sentinels = [tok.sentinel_id(i) for i in range(100)]
  assert len(set(sentinels)) == 100
  assert all(0 <= s < tok.vocab_size for s in sentinels)
  assert tok.processor.id_to_piece(sentinels[7]) == "<extra_id_7>"
  with pytest.raises(ValueError, match="extra_id_100"):
    tok.sentinel_id(100)
  special = tok.special_ids
  assert special.dtype == np.int32
  assert np.all(np.diff(special) > 0)
  expected = set(sentinels) | {tok.pad_id, tok.eos_id, tok.unk_id,
                               tok.bos_id, tok.mask_id, tok.cls_id,
                               tok.sep_id}
  assert expected <= set(special.tolist())


def test_trained_round_trip(trained, shakespeare_lines):
  tok, _ = trained
  texts = ["First Citizen: Before we proceed any further, hear me speak.",
           shakespeare_lines[-1]]
  for text in texts:
    ids = tok.encode(text)
    assert ids and tok.eos_id not in ids and tok.bos_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.pad_id] * 3) == text
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
  no_specials = set(tok.encode(" ".join(shakespeare_lines[:50])))
  assert not no_specials & set(tok.special_ids.tolist()) - {tok.unk_id}


def test_offsets_give_each_piece_its_visible_text(trained):
  tok = tokenizer_files.get_tokenizer(str(trained[1]) + ".model")
  text = "  Thou  art  più  fair,\tmy lord!"
  ids, spans = tok.encode_with_offsets(text)
  assert ids == tok.encode(text)
  pieces = [text[s:e] for s, e in spans]
  assert all(p == p.strip() for p in pieces)
  assert "".join(pieces) == "".join(text.split())
  assert [s for s, _ in spans] == sorted(s for s, _ in spans)


def test_training_is_deterministic(shakespeare_lines, tmp_path):
  a = sentencepiece_training.train_sentencepiece(shakespeare_lines, tmp_path / "a", 300)
  b = sentencepiece_training.train_sentencepiece(shakespeare_lines, tmp_path / "b", 300)
  assert (tmp_path / "a.model").read_bytes() == (
      tmp_path / "b.model").read_bytes()
  assert a.encode(shakespeare_lines[3]) == b.encode(shakespeare_lines[3])


def test_long_texts_are_split(shakespeare_lines, tmp_path):
  # One line far above SentencePiece's 4192-byte sentence limit.
  text = " ".join(shakespeare_lines)
  assert len(text.encode("utf-8")) > 3 * 4192
  chunks = list(sentencepiece_training._training_sentences([text], 4192))
  assert len(chunks) > 3
  assert all(len(c.encode("utf-8")) <= 4192 for c in chunks)
  assert " ".join(chunks).split() == text.split()
  word = "x" + "\u00e9" * 5000  # Odd byte alignment of 2-byte chars.
  giant = list(sentencepiece_training._training_sentences(["a " + word], 4192))
  assert all(len(c.encode("utf-8")) <= 4192 for c in giant)
  assert giant[0] == "a" and "".join(giant[1:]) == word
  verse = "\n".join(shakespeare_lines)  # one paragraph: cut between lines
  chunks = list(sentencepiece_training._training_sentences([verse], 4192))
  assert len(chunks) > 3 and "\n".join(chunks) == verse
  assert list(sentencepiece_training._training_sentences(["a\nb \n\n \n c\n"], 4192)) == [
      "a\nb", "c"]
  tok = sentencepiece_training.train_sentencepiece(
      [text], tmp_path / "long", vocab_size=300, num_sentinels=3)
  assert tok.vocab_size == 300 and tok.num_sentinels == 3
  assert tok.decode(tok.encode(shakespeare_lines[0])) == shakespeare_lines[0]


def _play(speeches: int = 120, seed: int = 0) -> str:
  """A synthetic play: speeches of a few lines, a blank line between them."""
  rng = np.random.default_rng(seed)
  parts = (["the cat", "a dog", "my friend", "the king", "our teacher"],
           ["sees", "likes", "finds", "calls", "follows"],
           ["the moon.", "a river!", "the house?", "an old song.", "the market,"])
  line = lambda: " ".join(rng.choice(p) for p in parts)
  return "\n\n".join(
      f"{rng.choice(['KING', 'QUEEN', 'FOOL'])}:\n"
      + "\n".join(line() for _ in range(rng.integers(1, 4)))
      for _ in range(speeches)) + "\n"


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_trained_tokenizer_keeps_line_breaks_and_tabs(model_type, tmp_path):
  tok = sentencepiece_training.train_sentencepiece(
      [_play()], tmp_path / "play", vocab_size=60, model_type=model_type,
      num_sentinels=3)
  newline = tok.processor.piece_to_id("\n")
  assert newline != tok.unk_id and tok.decode([newline]) == "\n"
  assert tok.word_starts[newline]  # the word after it has no U+2581
  text = ("KING:\nthe cat sees the moon.\n\nFOOL:\na dog\tfinds a river!\n"
          "my friend calls the house?\n")
  ids = tok.encode(text)
  assert ids.count(newline) == text.count("\n") and tok.unk_id not in ids
  assert tok.decode(ids) == text
  assert tok.decode(tok.encode("\n\nthe king:")) == "\n\nthe king:"
  # Spaces are still folded: runs become one, the ends go.
  assert tok.decode(tok.encode("  the cat  sees ")) == "the cat sees"


def test_byte_level_bpe_keeps_line_breaks():
  gpt2 = tokenizer_files.get_tokenizer(datadir.require_data("tokenizers",
                                                            "gpt2_vocab.json"))
  text = "KING:\nthe cat  sees the moon.\n\n\tFOOL:\n"
  assert gpt2.decode(gpt2.encode(text)) == text


def test_clm_recipe_rows_keep_the_line_breaks_of_the_source(tmp_path):
  """The CLM recipe reads tiny Shakespeare as TFDS gives it, one document
  of the whole text; a text file read whole stands in for it here."""
  from jaxtl.configs import pretrain_clm  # pylint: disable=import-outside-toplevel
  from jaxtl.pretraining import pipeline  # pylint: disable=import-outside-toplevel
  from jaxtl.pretraining import config as pretrain_config  # pylint: disable=import-outside-toplevel
  corpus = tmp_path / "play.txt"
  corpus.write_text(_play(), encoding="utf-8")
  config = pretrain_clm.get_config()
  with config.unlocked():
    config.data.source.update(kind="text", name="", manual_dir="", paragraphs=True)
    config.data.source.files = dict(train=[str(corpus)], validation=[str(corpus)])
  config.data.tokenizer.update(vocab_size=200)
  config.data.update(seq_len=32, batch_size=2)
  setup = pipeline.DataSetup(pretrain_config.of(config), str(tmp_path / "wd"))
  tok = setup.tokenizer
  rows = setup.rows_tokens("train")
  text = tok.decode(rows.ravel().tolist())
  assert "\n\n" in text and text.count("\n") > rows.shape[0]
  assert text == _play()[:len(text)]  # every row, as the source has it


def test_bad_model_type(tmp_path):
  with pytest.raises(ValueError, match="wordpiece"):
    sentencepiece_training.train_sentencepiece(["a b c"], tmp_path / "m", 100,
                                   model_type="wordpiece")


def test_vocab_too_large_is_a_clear_error(tmp_path):
  with pytest.raises(sentencepiece_training.VocabTooLarge,
                     match=r"m.model: the training text \(20 sentences\) gives at most "
                           r"\d+ pieces, not the 5000 asked") as e:
    sentencepiece_training.train_sentencepiece(["the cat sat on the mat"] * 20,
                                   tmp_path / "m", 5000)
  assert 0 < e.value.most < 5000
  assert not (tmp_path / "m.model").exists()
  # The pretraining pipeline names the key to change, and the size that fits.
  from jaxtl.data.config import DataConfig, TokenizerConfig  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pipeline  # pylint: disable=g-import-not-at-top
  data = DataConfig(tokenizer=TokenizerConfig(vocab_size=5000))
  with pytest.raises(ValueError, match=f"set --config.data.tokenizer.vocab_size={e.value.most} "
                                       "or less, or train on more text"):
    pipeline.build_tokenizer(data, str(tmp_path / "w"), lambda: ["the cat sat on the mat"] * 20)


def test_vocab_smaller_than_specials(tmp_path):
  with pytest.raises(ValueError, match="reserved"):
    sentencepiece_training.train_sentencepiece(["a b"], tmp_path / "m", 50)


def test_empty_corpus(tmp_path):
  with pytest.raises(ValueError, match="no non-empty text"):
    sentencepiece_training.train_sentencepiece(["", "  \n "], tmp_path / "m", 200)


def test_missing_model_file(tmp_path):
  path = tmp_path / "nope.model"
  with pytest.raises(FileNotFoundError, match="nope.model"):
    tokenizers.SentencePieceTokenizer(path)


def test_get_tokenizer_dispatch(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"tokenizer not found: .*vocab\.json"):
    tokenizer_files.get_tokenizer(str(tmp_path / "vocab.json"))
  (tmp_path / "words.csv").write_text("a,b")
  with pytest.raises(ValueError, match=r"unsupported tokenizer .*words\.csv.*\.model"):
    tokenizer_files.get_tokenizer(str(tmp_path / "words.csv"))


@pytest.fixture(scope="module")
def t5() -> tokenizers.Tokenizer:
  return tokenizer_files.get_tokenizer(str(datadir.require_data(*T5_MODEL)))


def test_t5_ids(t5):
  assert isinstance(t5, tokenizers.SentencePieceTokenizer)
  assert t5.vocab_size == 32101
  assert (t5.pad_id, t5.eos_id, t5.bos_id, t5.unk_id) == (0, 1, 2, 3)
  assert t5.mask_id is None and t5.cls_id is None and t5.sep_id is None
  assert t5.num_sentinels == 100
  assert t5.sentinel_id(0) == 32100
  assert t5.sentinel_id(99) == 32001
  with pytest.raises(ValueError, match="extra_id_100"):
    t5.sentinel_id(100)
  special = t5.special_ids.tolist()
  assert special[:4] == [0, 1, 2, 3]
  assert len(special) == 104 and special[-1] == 32100


def test_t5_round_trip(t5):
  text = "The quick brown fox jumps over the lazy dog, twice in 2024."
  ids = t5.encode(text)
  assert ids and max(ids) < 32000 and t5.eos_id not in ids
  assert t5.decode(ids) == text
  assert t5.decode([t5.pad_id] + ids + [t5.eos_id, t5.pad_id]) == text
  assert t5.encode_batch([text, "hello"]) == [ids, t5.encode("hello")]
  assert t5.decode([t5.sentinel_id(0)]).strip() == "<extra_id_0>"


def test_classic_t5_virtual_sentinels(tmp_path):
  """A 32000-piece model without sentinel pieces follows the T5 convention."""
  pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
  proto = pb.ModelProto()
  proto.ParseFromString(datadir.require_data(*T5_MODEL).read_bytes())
  del proto.pieces[32000:]  # Drops the sentinel pieces (and one more).
  path = tmp_path / "classic.model"
  path.write_bytes(proto.SerializeToString())
  tok = tokenizers.SentencePieceTokenizer(path)
  assert tok.vocab_size == 32100 and tok.num_sentinels == 100
  assert tok.sentinel_id(0) == 32099 and tok.sentinel_id(99) == 32000
  assert 32099 in tok.special_ids
  ids = tok.encode("hello world")
  assert tok.decode(ids + [32099] + ids) == (
      "hello world <extra_id_0> hello world")


def test_model_without_sentinels(shakespeare_lines, tmp_path):
  tok = sentencepiece_training.train_sentencepiece(
      shakespeare_lines, tmp_path / "small", vocab_size=100, num_sentinels=0)
  assert tok.num_sentinels == 0 and tok.vocab_size == 100
  with pytest.raises(ValueError, match="extra_id_0"):
    tok.sentinel_id(0)


def test_word_starts_mark_the_first_piece_of_each_word(trained):
  tok, _ = trained
  starts = tok.word_starts
  assert starts.shape == (tok.vocab_size,) and starts[tok.special_ids].all()
  for word in ("thee", "wherefore", "gentlemen"):
    ids = tok.encode(f"and {word}")
    assert starts[ids[0]] and starts[ids[-len(tok.encode(word)):]][0]
    assert not starts[tok.encode(word)[1:]].any()  # its continuations


def test_whole_word_mlm_masks_every_piece_of_a_chosen_word(trained, shakespeare_lines):
  import types  # pylint: disable=import-outside-toplevel
  from jaxtl.configs import common  # pylint: disable=import-outside-toplevel
  from jaxtl.objectives import mlm  # pylint: disable=import-outside-toplevel
  tok, _ = trained
  objective = common.objective_config(name="mlm", whole_word=True, mask_rate=0.3)
  data = types.SimpleNamespace(seq_len=256, packing="pack")
  prepared = mlm.prepare(tok, objective, data)
  ids = np.array(tok.encode(" ".join(shakespeare_lines[:40]))[:256], np.int32)
  row = {"tokens": ids, "segment_ids": np.ones_like(ids),
         "positions": np.arange(ids.size, dtype=np.int32)}
  starts = tok.word_starts[ids]
  assert (~starts).sum() > 20  # words of several pieces exist
  for seed in range(5):
    chosen = prepared.make_example(row, np.random.default_rng(seed))[
        "encoder_loss_weights"] > 0
    continued = ~starts[1:]  # position i + 1 continues position i's word
    np.testing.assert_array_equal(chosen[1:][continued], chosen[:-1][continued])
    assert abs(chosen.mean() - 0.3) < 0.05


EDGE_TEXTS = ["  leading,  double  and trailing spaces  ", "a\nline break\tand a tab",
              "Ünïcödé ﬁ café ①", "[MASK] whole [CLS] pieces [SEP]", "<extra_id_0> x", "", " "]


def test_a_sentencepiece_model_rebuilt_for_transformers_gives_its_ids(trained,
                                                                      shakespeare_lines):
  """An export's tokenizer.json (jaxtl.convert.hf_tokenizer) encodes as the
  SentencePiece model it was made from: ours (unigram and bpe, user-defined
  pieces) and T5's (nmt_nfkc)."""
  from jaxtl.convert import hf_tokenizer  # pylint: disable=g-import-not-at-top
  texts = shakespeare_lines[300:] + EDGE_TEXTS
  models = [trained[0]]
  if (t5 := datadir.data_dir() / T5_MODEL[0] / T5_MODEL[1]).is_file():
    models.append(tokenizers.SentencePieceTokenizer(t5))
  for tok in models:
    fast = hf_tokenizer.from_sentencepiece(tok)
    assert [e.ids for e in fast.encode_batch(texts)] == tok.encode_batch(texts), tok
    assert fast.get_vocab_size() == tok.vocab_size


def test_sentinels_above_the_pieces_are_added_to_the_rebuilt_tokenizer(shakespeare_lines,
                                                                       tmp_path):
  """Classic T5 models keep <extra_id_i> above their pieces, <extra_id_0>
  last (jaxtl's SentencePieceTokenizer, T5Tokenizer): the rebuilt one too."""
  from jaxtl.convert import hf_tokenizer  # pylint: disable=g-import-not-at-top
  tok = sentencepiece_training.train_sentencepiece(shakespeare_lines, tmp_path / "m", 300, num_sentinels=0)
  pieces = tok.processor.get_piece_size()
  tok._sentinels = tuple(pieces + 2 - i for i in range(3))  # pylint: disable=protected-access
  fast = hf_tokenizer.from_sentencepiece(tok)
  assert [fast.token_to_id(f"<extra_id_{i}>") for i in range(3)] == [pieces + 2, pieces + 1,
                                                                     pieces]
  assert fast.encode("a <extra_id_1> b").ids == [*fast.encode("a").ids, pieces + 1,
                                                 *fast.encode("b").ids]
