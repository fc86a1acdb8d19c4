"""Prompting: rank classification == the likeliest label words computed one
by one, demonstrations drawn by the seed, calibration's arithmetic,
multi-token label words, and the few-shot table end to end on real tasks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.data.tokenizers import Tokenizer
from jaxtl.eval import few_shot, prompting
from jaxtl.models import TransformerConfig, build_model
from jaxtl.tasks.examples import Examples

import datadir

WORDS = ("<pad> <eos> <unk> review : sentiment good bad very so film plot was "
         "dull great fine N/A [MASK] the a").split()


class WordTokenizer(Tokenizer):
  """Whitespace-separated words of :data:`WORDS`: one id per word, so label
  words of two words are two tokens."""
  vocab_size, pad_id, eos_id, unk_id = len(WORDS), 0, 1, 2

  def encode(self, text):
    return [WORDS.index(w) if w in WORDS else self.unk_id for w in text.split()]

  def decode(self, ids):
    return " ".join(WORDS[i] for i in ids if i)

  def fingerprint(self):
    return "words"


TOK = WordTokenizer()
CFG = TransformerConfig(family="decoder", vocab_size=len(WORDS), d_model=32, num_heads=4,
                        head_dim=8, mlp_dim=64, num_layers=2, max_len=64, dropout_rate=0.0)
# Two-token words for both classes; "good" / "very good" share a token, so
# only the sum over both tokens tells them apart.
PROMPT = prompting.Prompt("review : {text} sentiment : {label}", ("very bad", "very good"))
TRAIN = Examples(texts=["the film was dull", "a great plot", "the plot was fine",
                        "so dull", "a great film"], labels=[0, 1, 1, 0, 1],
                 label_names=("negative", "positive"))
TEST = Examples(texts=["the film was great", "a dull plot", "the plot was bad"],
                labels=[1, 0, 0], label_names=("negative", "positive"))


@functools.lru_cache(maxsize=None)
def _params():
  params = build_model(CFG).init(jax.random.key(1), jnp.ones((1, 4), jnp.int32))["params"]
  # Sharper than the init, so label scores differ clearly.
  return jax.tree.map(lambda x: x * 4.0 if x.shape[:1] == (len(WORDS),) else x, params)


APPLY = jax.jit(build_model(CFG).apply)


def _label_logp(context, word):
  """log p(word | context) from one unpadded pass over the whole text."""
  ctx, cont = TOK.encode(context), TOK.encode(word)
  logits = APPLY({"params": _params()}, np.array([ctx + cont[:-1]]))["logits"][0]
  logp = jax.nn.log_softmax(logits[len(ctx) - 1:])
  return sum(float(logp[i, t]) for i, t in enumerate(cont))


@pytest.mark.slow
def test_rank_classification_picks_the_likeliest_label_words():
  r = prompting.evaluate(CFG, _params(), TOK, PROMPT, TRAIN, TEST, shots=2, seed=0,
                         batch_size=4)
  prefix = prompting.demonstration_text(PROMPT, TRAIN, r.demonstrations)
  def scores(texts):
    return np.array([[_label_logp(prefix + PROMPT.fill(t), w) for w in PROMPT.label_words]
                     for t in texts])
  want = scores(TEST.texts)
  assert r.predictions == want.argmax(-1).tolist()
  assert r.accuracy == np.mean(want.argmax(-1) == np.array(TEST.labels))
  cal = prompting.calibrate(want, scores(PROMPT.content_free)).argmax(-1)
  assert r.calibrated_predictions == cal.tolist()
  assert r.truncated == 0


def test_demonstrations_are_drawn_by_the_seed():
  a, b = (prompting.demonstrations(TRAIN, 3, 7) for _ in range(2))
  assert a == b and len(set(a)) == 3
  assert any(prompting.demonstrations(TRAIN, 3, s) != a for s in range(1, 5))
  text = prompting.demonstration_text(PROMPT, TRAIN, a)
  assert text == "".join(f"review : {TRAIN.texts[i]} sentiment : "
                         f"{PROMPT.label_words[TRAIN.labels[i]]}\n\n" for i in a)
  assert prompting.demonstration_text(PROMPT, TRAIN, []) == ""
  with pytest.raises(ValueError, match="6 shots but only 5"):
    prompting.demonstrations(TRAIN, 6, 0)


def test_calibration_divides_by_the_content_free_label_distribution():
  p_NY = np.array([[0.6, 0.3, 0.1], [0.5, 0.1, 0.4]])
  cf_CY = np.log(np.array([[0.8, 0.1, 0.1], [0.4, 0.3, 0.3]]) * 0.01)  # unnormalised
  p_cf = np.array([0.6, 0.2, 0.2])  # the mean of the normalised rows
  got = prompting.calibrate(np.log(p_NY), cf_CY)
  want = p_NY / p_cf
  np.testing.assert_allclose(np.exp(got) / np.exp(got).sum(-1, keepdims=True),
                             want / want.sum(-1, keepdims=True))
  assert got.argmax(-1).tolist() == [1, 2]  # the prompt's bias towards class 0 undone
  # A content-free distribution that is uniform changes no ranking.
  uniform = prompting.calibrate(np.log(p_NY), np.zeros((1, 3)))
  assert uniform.argmax(-1).tolist() == p_NY.argmax(-1).tolist()


def test_label_words_of_several_tokens_and_trailing_spaces():
  ctx, cont = prompting.split_encode(TOK, "review : so dull sentiment : ", "very bad")
  assert TOK.decode(cont) == "very bad" and TOK.decode(ctx).endswith("sentiment :")
  vocab = datadir.require_data("tokenizers", "gpt2_vocab.json")
  from jaxtl.data.hf_tokenizers import HuggingFaceTokenizer  # pylint: disable=g-import-not-at-top
  gpt2 = HuggingFaceTokenizer.byte_level_bpe(vocab, vocab.parent / "gpt2_merges.txt")
  ctx, cont = prompting.split_encode(gpt2, "Sentiment: ", "positive")
  assert cont == gpt2.encode(" positive") and gpt2.decode(ctx) == "Sentiment:"


def test_prompts_are_checked():
  with pytest.raises(ValueError, match="must end with"):
    prompting.Prompt("{label}: {text}", ("a", "b"))
  with pytest.raises(ValueError, match="fields must be"):
    prompting.Prompt("{txt} {label}", ("a", "b"))
  with pytest.raises(ValueError, match="distinct"):
    prompting.Prompt("{text} {label}", ("a", "a"))
  with pytest.raises(ValueError, match="3 label words"):
    prompting.evaluate(CFG, _params(), TOK, prompting.Prompt("{text} {label}",
                                                              ("a", "b", "c")),
                       TRAIN, TEST, shots=0, seed=0)
  assert prompting.default_prompt("cola", ("unacceptable", "acceptable")).label_words == (
      "unacceptable", "acceptable")


@pytest.mark.slow
def test_few_shot_table_and_figure_on_real_tasks(tmp_path):
  vocab = datadir.require_data("tokenizers", "gpt2_vocab.json")
  datadir.require_data("glue", "SST-2", "dev.tsv")
  datadir.require_data("trec", "TREC_10.label")
  from jaxtl.data.hf_tokenizers import HuggingFaceTokenizer  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining.pretrained import Pretrained  # pylint: disable=g-import-not-at-top
  tok = HuggingFaceTokenizer.byte_level_bpe(vocab, vocab.parent / "gpt2_merges.txt")
  cfg = CFG.replace(vocab_size=tok.vocab_size, max_len=128)
  params = build_model(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  rows = few_shot.run(Pretrained(cfg, tok, params, {}), ["sst2", "trec"], [0, 2], [0, 1],
                      max_eval_examples=6, batch_size=16)
  assert [(r["task"], r["shots"], r["seed"]) for r in rows] == [
      ("sst2", 0, 0), ("sst2", 2, 0), ("sst2", 2, 1),
      ("trec", 0, 0), ("trec", 2, 0), ("trec", 2, 1)]
  assert all(len(r["predictions"]) == 6 and 0 <= r["accuracy"] <= 1 for r in rows)
  assert rows[1]["demonstrations"] != rows[2]["demonstrations"]
  few_shot.write(rows, str(tmp_path))
  table = (tmp_path / few_shot.MARKDOWN).read_text()
  assert "| trec (test, 6) | 2 |" in table and "±" in table
  assert (tmp_path / few_shot.FIGURE).stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.subprocess
def test_command_line_writes_the_table(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from jaxtl import convert  # pylint: disable=g-import-not-at-top
  vocab = datadir.require_data("tokenizers", "gpt2_vocab.json")
  datadir.require_data("glue", "SST-2", "dev.tsv")
  cfg = CFG.replace(vocab_size=50257, tie_embeddings=True, activation="gelu_new",
                    norm_eps=1e-5)
  params = build_model(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  convert.export_hf(tmp_path / "gpt2", cfg, params)
  out = subprocess.run(
      [sys.executable, "-m", "jaxtl", "prompt", f"--checkpoint={tmp_path / 'gpt2'}",
       f"--tokenizer={vocab}", "--task=sst2", "--shots=1", "--seeds=0",
       "--max_eval_examples=4", f"--out={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=300, check=True)
  assert "| sst2 (dev, 4) | 1 |" in out.stdout
  assert {p.name for p in (tmp_path / "out").iterdir()} == {
      few_shot.MARKDOWN, few_shot.FIGURE, few_shot.RESULTS}
