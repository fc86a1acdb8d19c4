"""Task features: framing, pair truncation, first-sub-word tagging labels."""

import numpy as np
import pytest

from jaxtl.tasks import features as task_features, readers as tasks
from jaxtl.tasks.examples import Examples
from jaxtl.data.sentencepiece_training import train_sentencepiece

import datadir


@pytest.fixture(scope="module")
def bert_tok(tmp_path_factory):
  text = datadir.require_data("tiny_shakespeare", "input.txt").read_text()
  lines = [l for l in text.splitlines() if l.strip()][:3000]
  return train_sentencepiece(lines, tmp_path_factory.mktemp("tok") / "sp", 600)


def test_pairs_are_framed_with_token_types_and_truncated_longest_first(bert_tok):
  tok = bert_tok
  ex = Examples(texts=["to be or not to be", "a"], text_pairs=["that is", "b " * 40],
                labels=[1, 0], label_names=("no", "yes"))
  f = task_features.encode_sequences(ex, tok, 16, "encoder")
  row, types = f.arrays["encoder_input_tokens"][0], f.arrays["encoder_token_type_ids"][0]
  a, b = tok.encode("to be or not to be"), tok.encode("that is")
  expected = [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id]
  assert row[:len(expected)].tolist() == expected
  assert types[:len(expected)].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert f.arrays["encoder_segment_ids"][0].sum() == len(expected)
  assert f.truncated == 1  # the second pair is cut to fit 16
  assert f.arrays["encoder_segment_ids"][1].sum() == 16
  assert f.arrays["encoder_input_tokens"][1, -1] == tok.sep_id
  assert f.arrays["labels"].dtype == np.int32


def test_decoder_layout_ends_in_eos_for_last_token_pooling(bert_tok):
  ex = Examples(texts=["to be"], labels=[2.5])  # regression: float labels
  f = task_features.encode_sequences(ex, bert_tok, 8, "decoder")
  row = f.arrays["decoder_input_tokens"][0]
  n = f.arrays["decoder_segment_ids"][0].sum()
  assert row[n - 1] == bert_tok.eos_id and f.arrays["labels"].dtype == np.float32


def test_tagging_labels_only_first_subwords_on_real_ud(bert_tok):
  ex = tasks.read_ud_pos("dev", datadir.require_data())
  f = task_features.encode_tagging(ex, bert_tok, 64, "encoder")
  w = f.arrays["label_weights"]
  for i in range(50):
    n_words = len(ex.words[i])
    if n_words + 2 <= 64 and w[i].sum() == n_words:
      pos = np.flatnonzero(w[i])
      assert f.arrays["labels"][i, pos].tolist() == list(ex.labels[i])
      pieces = [len(bert_tok.encode(word)) or 1 for word in ex.words[i]]
      assert pos.tolist() == (1 + np.cumsum([0] + pieces[:-1])).tolist()
  assert f.truncated > 0  # some EWT sentences need more than 64 pieces
