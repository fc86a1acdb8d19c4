"""Generative fine-tuning (task kind generation): the loss is on the output
only, padding changes nothing, decoding is the teacher-forced argmax, the
metrics are rouge-score's and sacrebleu's, and a task=files run trains,
scores and predicts text end to end."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.decoding import generate as generate_lib
from jaxtl.tasks import file_predictions as predict_lib
from jaxtl.data.tokenizer_files import get_tokenizer
from jaxtl.models import TransformerConfig, build_model, paths
from jaxtl.models.heads import TaskModel
from jaxtl.tasks import file_task, finetune, generation, generation_metrics, kinds, padding
from jaxtl.tasks.examples import Examples

import file_task_test

_WORDS = ("red", "green", "blue", "cat", "dog", "fish", "one", "two", "three")
SMALL = dict(vocab_size=0, d_model=16, num_heads=2, head_dim=8, mlp_dim=32, num_layers=1,
             max_len=32, dropout_rate=0.0)
GPT2 = dict(family="decoder", **SMALL)
T5 = dict(family="encoder_decoder", position="relative", norm="rmsnorm", use_bias=False,
          scale_attention=False, relative_buckets=8, relative_max_distance=16, **SMALL)
# BART's layers, its decoder starting from </s> as Hugging Face's does.
BART = dict(family="encoder_decoder", norm_eps=1e-5, pre_norm=False, embed_norm=True,
            lm_head_bias=True, decoder_start="eos", **SMALL)


def _config(tok, fields):
  return TransformerConfig(**{**fields, "vocab_size": tok.vocab_size})


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":",
                             "question", "context", *_WORDS]) + "\n")
  return get_tokenizer(str(path))


class _Task:
  """The config.task fields generation reads."""
  text_fields = ("question", "context")
  max_len, max_target_len, num_beams, metrics = 24, 6, 1, ""


def _examples(n=4, seed=0):
  rng = np.random.default_rng(seed)
  pick = lambda k: " ".join(rng.choice(_WORDS, k))
  return Examples([pick(3) for _ in range(n)], [(pick(int(rng.integers(1, 4))),)
                                                 for _ in range(n)],
                  text_pairs=[pick(int(rng.integers(2, 6))) for _ in range(n)])


def _model(tok, family_fields, seed=0):
  cfg = _config(tok, family_fields)
  model = TaskModel(cfg, kind=generation.KIND, pad_id=tok.pad_id, eos_id=tok.eos_id)
  params = jax.jit(model.init)(jax.random.key(seed), jnp.ones((1, 8), jnp.int32))["params"]
  # Sharper distributions than the init's, so greedy paths are not near-ties.
  return model, jax.tree.map(lambda x: x * 4.0 if x.ndim == 2 and x.shape[0] == cfg.vocab_size
                             else x, params)


def test_decoder_only_loss_weights_cover_the_output_and_eos_only(tok):
  task, ex = _Task(), _examples()
  feats = generation.encode(ex, tok, task, _config(tok, GPT2))
  a = feats.arrays
  for i, (q, c) in enumerate(zip(ex.texts, ex.text_pairs)):
    prompt = tok.encode(f"question: {q} context: {c}") + [tok.sep_id]
    target = tok.encode(ex.labels[i][0]) + [tok.eos_id]
    w = a["decoder_loss_weights"][i]
    assert w.sum() == len(target)
    # Weighted positions predict exactly the output's tokens, then </s>.
    assert a["decoder_target_tokens"][i][w > 0].tolist() == target
    assert np.flatnonzero(w)[0] == len(prompt) - 1
    n = len(prompt) + len(target) - 1
    assert a["decoder_input_tokens"][i][:n].tolist() == (prompt + target)[:-1]
    assert a["decoder_segment_ids"][i].sum() == n
    # The left-padded prompt generation reads ends at the separator.
    assert a[generation.PROMPT_TOKENS][i][a[generation.PROMPT_MASK][i] > 0].tolist() == prompt
  target = tok.encode(ex.labels[0][0]) + [tok.eos_id]
  for fields, start in ((T5, tok.pad_id), (BART, tok.eos_id)):
    t5 = generation.encode(ex, tok, task, _config(tok, fields)).arrays
    assert t5["decoder_target_tokens"][0][:len(target)].tolist() == target
    assert t5["decoder_input_tokens"][0][:len(target)].tolist() == [start] + target[:-1]
    assert t5["decoder_loss_weights"][0].sum() == len(target)


@pytest.mark.slow
@pytest.mark.parametrize("fields", [GPT2, T5], ids=["gpt2", "t5"])
def test_the_loss_is_the_output_tokens_cross_entropy_whatever_the_padding(tok, fields):
  task = _Task()
  family = fields["family"]
  model, params = _model(tok, fields)
  feats = generation.encode(_examples(), tok, task, model.config)
  loss_fn = jax.jit(finetune.make_task_loss_fn(model))
  batch = {k: jnp.asarray(v) for k, v in feats.arrays.items()}
  _, sums = loss_fn(params, batch, None)
  # By hand: -log p(target) at the weighted positions of the full logits.
  apply = jax.jit(functools.partial(build_model(model.config).apply,
                                    {"params": params[paths.BACKBONE]}))
  if family == "decoder":
    logits = apply(batch["decoder_input_tokens"], batch["decoder_segment_ids"])["logits"]
  else:
    logits = apply(batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                   batch["encoder_segment_ids"], batch["decoder_segment_ids"])["logits"]
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch["decoder_target_tokens"][..., None], -1)[..., 0]
  w = batch["decoder_loss_weights"]
  np.testing.assert_allclose(float(sums["loss_sum"]), float((nll * w).sum()), rtol=1e-5)
  assert float(sums["weight_sum"]) == float(w.sum())
  # Cutting the padding (as training does) changes nothing.
  side = "decoder" if family == "decoder" else "encoder"
  trimmed = padding.trim_padding(feats.arrays, side, 8)
  assert trimmed[f"{side}_input_tokens"].shape[1] < task.max_len  # GPT-2's too
  _, other = loss_fn(params, {k: jnp.asarray(v) for k, v in trimmed.items()}, None)
  np.testing.assert_allclose(float(other["loss_sum"]), float(sums["loss_sum"]), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("fields", [GPT2, T5, BART], ids=["gpt2", "t5", "bart"])
def test_decoding_writes_the_teacher_forced_argmax_whatever_the_padding(tok, fields):
  task, family = _Task(), fields["family"]
  model, params = _model(tok, fields, seed=1)
  ex = _examples(n=3, seed=1)
  feats = generation.encode(ex, tok, task, model.config)
  run = jax.jit(kinds.get(generation.KIND).forward(model, task, tok))
  ids = np.asarray(run(params, feats.arrays))
  assert ids.shape == (3, task.max_target_len)
  # Feed what was written back with teacher forcing: each token is the
  # argmax after the ones before it (up to </s>). Causal: what follows a
  # position never changes its logits, so all rows go in one call.
  a, lm = feats.arrays, build_model(model.config)
  apply = jax.jit(functools.partial(lm.apply, {"params": params[paths.BACKBONE]}))
  if family == "decoder":
    prompts = [p[m > 0].tolist() for p, m in zip(a[generation.PROMPT_TOKENS],
                                                  a[generation.PROMPT_MASK])]
    seqs = np.asarray([p + [tok.pad_id] * (24 - len(p)) for p in prompts])
    starts = [len(p) - 1 for p in prompts]
    for i, p in enumerate(prompts):
      seqs[i, len(p):len(p) + ids.shape[1]] = ids[i]
    logits = apply(seqs)["logits"]
  else:
    start = model.config.decoder_start_id(tok.pad_id, tok.eos_id)
    dec = np.concatenate([np.full((3, 1), start), ids[:, :-1]], 1)
    logits = apply(a["encoder_input_tokens"], dec, a["encoder_segment_ids"])["logits"]
    starts = [0] * 3
  for i, row in enumerate(ids.tolist()):
    n = row.index(tok.eos_id) + 1 if tok.eos_id in row else len(row)
    argmax = np.argmax(logits[i, starts[i]:starts[i] + n], -1)
    assert argmax.tolist() == row[:n]
  # One example alone (less padding) is decoded the same.
  alone = generation.encode(ex.subset([0]), tok, task, model.config).arrays
  if family == "encoder_decoder":
    alone = padding.trim_padding(alone, "encoder", 8)
  np.testing.assert_array_equal(np.asarray(run(params, alone))[0], ids[0])


def test_metrics_come_from_rouge_score_and_sacrebleu():
  from rouge_score import rouge_scorer
  import sacrebleu
  preds = ["the cat sat on the mat", "a dog", "Denver Broncos"]
  refs = [("the cat is on the mat",), ("the dog barked", "a dog"), ("the Denver Broncos",)]
  got = generation_metrics.generation_metrics(generation.DEFAULT_METRICS, preds, refs)
  assert list(got) == list(generation.DEFAULT_METRICS)
  scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
  best = [max(scorer.score(r, p)["rougeL"].fmeasure for r in rs)
          for p, rs in zip(preds, refs)]
  assert got["rougeL"] == pytest.approx(100 * np.mean(best))
  bleu = sacrebleu.corpus_bleu(preds, [[r[0] for r in refs], [None, "a dog", None]])
  assert got["bleu"] == pytest.approx(bleu.score)
  # SQuAD's normalisation: articles and case do not count; any reference will do.
  assert got["exact_match"] == pytest.approx(100 * 2 / 3)
  assert 0 < got["f1"] < 100
  with pytest.raises(ValueError, match="unknown generation metric.*rougeL"):
    generation_metrics.generation_metrics(["rogue"], preds, refs)


@pytest.mark.slow
def test_files_generation_trains_scores_and_predicts_text(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS]) + "\n")
  rng = np.random.default_rng(0)
  rows = [{"source": " ".join(rng.choice(_WORDS, 4))} for _ in range(24)]
  for r in rows:  # copy the first two words; two references for some
    r["target"] = r["source"].split()[:2] if len(r["source"]) % 2 else \
        " ".join(r["source"].split()[:2])
    if isinstance(r["target"], list):
      r["target"] = [" ".join(r["target"]), r["source"]]
  train = tmp_path / "train.jsonl"
  train.write_text("".join(json.dumps(r) + "\n" for r in rows))
  workdir = tmp_path / "bart"
  # An encoder-decoder (T5's code path but for its positions, which the tests
  # above cover) starting to decode from </s> as Hugging Face's BART does:
  # training, decoding and the reloaded workdir (model_config.json) agree.
  config = file_task_test._config(
      "--config=configs/finetune.py:task=files,model=bart_tiny",
      "--config.model.decoder_start=eos", f"--config.tokenizer_path={vocab}",
      f"--config.task.train={train}", "--config.task.kind=generation",
      "--config.task.text_fields=('source',)", "--config.task.label_field=target",
      "--config.task.max_len=16", "--config.task.max_target_len=4",
      "--config.task.dev_fraction=0.34", "--config.task.num_beams=2",
      "--config.model.num_layers=1", "--config.model.num_decoder_layers=1",
      "--config.model.d_model=16", "--config.model.num_heads=2",
      "--config.model.head_dim=8", "--config.model.mlp_dim=32",
      "--config.train.epochs=1", "--config.train.batch_size=8",
      "--config.train.checkpoint_every=0")
  results = finetune.finetune_and_evaluate(config, str(workdir))
  assert list(results["test"]) == list(generation.DEFAULT_METRICS)
  assert json.loads((workdir / "results.json").read_text())["best_dev"] is not None
  assert all(0.0 <= v <= 100.0 for v in results["test"].values())
  assert results["new"] == []  # the LM writes the text: no head
  assert json.loads((workdir / "model_config.json").read_text())["decoder_start"] == "eos"
  inputs = tmp_path / "in.jsonl"
  inputs.write_text(json.dumps({"source": "red cat one two"}) + "\n")
  out = tmp_path / "out.jsonl"
  assert predict_lib.predict_file(str(workdir), str(inputs), str(out)) == 1
  row = json.loads(out.read_text())
  assert row["source"] == "red cat one two" and isinstance(row["generated"], str)


def test_generation_refuses_what_cannot_write_text(tok):
  with pytest.raises(ValueError, match="encoder"):
    generation.encode(_examples(), tok, _Task(), TransformerConfig(family="encoder"))
  short = type("Short", (_Task,), {"max_len": 6})()
  with pytest.raises(ValueError, match="max_len=6 must exceed max_target_len"):
    generation.encode(_examples(), tok, short, _config(tok, GPT2))
  cfg = TransformerConfig(**{**GPT2, "vocab_size": tok.vocab_size})
  with pytest.raises(ValueError, match="beam search"):
    generate_lib.generate(cfg, None, np.ones((1, 2), np.int32),
                          gen=generate_lib.GenerationConfig(num_beams=2))


def test_file_targets_are_texts_or_reference_lists_and_bad_ones_name_their_line(tmp_path):
  path = tmp_path / "train.jsonl"
  rows = [{"doc": "a b", "summary": "a"}, {"doc": "c d", "summary": ["c", "d c"]},
          {"doc": "e f", "summary": 3}, {"doc": "g h", "summary": [" "]}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  spec = file_task.FileTask(("doc",), "summary", kind="generation")
  with pytest.raises(ValueError, match=f"{path}:3: target 3 is not a non-empty text"):
    file_task.read_split(spec, str(path))
  ex = file_task.read_split(spec, str(path), on_error="skip")
  assert ex.labels == [("a",), ("c", "d c")] and ex.label_names is None
  assert ex.skipped == 2 and file_task.train_labels(spec, ex) is None
