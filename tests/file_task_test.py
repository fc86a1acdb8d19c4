"""task=files: labeled data from the user's own CSV / TSV / JSON lines /
Parquet files, configured from the command line only."""

from __future__ import annotations

import gzip
import json

import pytest
from absl import flags
from ml_collections import config_flags

import datadir
import jaxtl
from jaxtl.programs import cli
from jaxtl.data import row_files
from jaxtl.tasks import config as tasks_config
from jaxtl.tasks import file_task, finetune, readers
from jaxtl.tasks.examples import Examples

TEXT = file_task.FileTask(("text",), "label")


def _config(*argv: str):
  """The config exactly as ``jaxtl finetune ARGV`` builds it."""
  argv = ["main", *cli.with_recipe_paths(list(argv))]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  return values.config


def _task(config) -> tasks_config.TaskConfig:
  """The typed task section of a fine-tuning config, as the run reads it."""
  return tasks_config.of(config).task


_WORDS = ("good", "great", "bad", "awful", "fine", "dull")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  """A WordPiece vocabulary of the test texts' words: a tiny random BERT
  needs no pretraining run (or data) to fine-tune."""
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "film",
                             "cast", "word", *_WORDS]) + "\n")
  return str(path)


def _finetune(vocab, workdir, *flags_):
  """A tiny fine-tuning run through configs/finetune.py and its flags."""
  config = _config("--config=configs/finetune.py:task=files",
                   f"--config.tokenizer_path={vocab}", "--config.model.num_layers=1",
                   "--config.model.d_model=16", "--config.model.num_heads=2",
                   "--config.model.head_dim=8", "--config.model.mlp_dim=32",
                   "--config.train.epochs=1", "--config.train.checkpoint_every=0",
                   "--config.train.batch_size=8", "--config.task.max_len=16",
                   "--config.train.length_multiple=16", *flags_)
  return finetune.finetune_and_evaluate(config, str(workdir))


# --- Reading -----------------------------------------------------------------


def test_csv_quoted_commas_and_newlines_are_read_and_labels_sorted(tmp_path):
  path = tmp_path / "reviews.csv"
  path.write_text('id,text,label\n1,"Good, really good",pos\n'
                  '2,"Two\nlines, a ""quote""",neg\n3,fine,pos\n')
  ex = file_task.read_split(TEXT, str(path))
  assert ex.texts == ["Good, really good", 'Two\nlines, a "quote"', "fine"]
  assert ex.label_names == ("neg", "pos") and ex.labels == [1, 0, 1]
  assert ex.lines == [f"{path}:2", f"{path}:3", f"{path}:5"]


def test_a_table_with_another_separator_than_its_name_says_is_named_so(tmp_path):
  for name, content, says in (
      ("a.csv", "text;label\nok;pos\n", r"separated by semicolons: save it with commas"),
      ("b.csv", "text\tlabel\nok\tpos\n", r"separated by tabs: --config.task.format=tsv"),
      ("c.tsv", "text,label\nok,pos\n", r"separated by commas: --config.task.format=csv"),
      ("d.csv", "words,label\nok,pos\n", r"the header has \['words', 'label'\]$")):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=rf"{name}:1: no column 'text'; .*{says}"):
      file_task.read_split(TEXT, str(tmp_path / name))


def test_integer_labels_keep_their_order_and_gzip_is_looked_through(tmp_path):
  path = tmp_path / "stars.jsonl.gz"
  with gzip.open(path, "wt") as f:
    for i, stars in enumerate([10, 2, 1, 2]):
      f.write(json.dumps({"text": f"review {i}", "stars": stars}) + "\n")
  ex = file_task.read_split(file_task.FileTask(("text",), "stars"), str(path))
  assert ex.label_names == ("1", "2", "10") and ex.labels == [2, 1, 0, 1]


def test_label_names_rename_a_files_classes_for_predictions(tmp_path):
  """0/1 labels, as many CSVs have them, predicted as negative/positive."""
  train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
  train.write_text("text,label\n" + "".join(f"w{i} w{i + 1},{i % 2}\n" for i in range(8)))
  dev.write_text("text,label\na b,1\nc d,0\n")
  config = _config("--config=configs/finetune.py:task=files", f"--config.task.train={train}",
                   f"--config.task.dev={dev}", "--config.task.labels=0,1",
                   "--config.task.label_names=negative,positive")
  splits = finetune.load_task_splits(_task(config), 0)
  assert splits["train"].label_names == ("negative", "positive")
  assert splits["train"].labels[:2] == [0, 1] and splits["dev"].labels == [1, 0]
  config.task.label_names = ("negative", "neutral", "positive")
  with pytest.raises(ValueError, match=r"names 3 classes and config.task.labels=\(0, 1\) "
                                       r"has 2: give both in one order"):
    _task(config)


def test_parquet_pairs_tagging_and_regression(tmp_path):
  pq = pytest.importorskip("pyarrow.parquet")
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "nli.parquet")
  pq.write_table(pa.table({"premise": ["A man", "A cat"], "hypothesis": ["A person", "x"],
                           "label": [0, 2]}), path)
  pair = file_task.FileTask(("premise", "hypothesis"), "label")
  ex = file_task.read_split(pair, path)
  assert (ex.texts, ex.text_pairs, ex.labels) == (["A man", "A cat"], ["A person", "x"],
                                                  [0, 1])
  assert ex.lines == [f"{path}:row 1", f"{path}:row 2"]
  tags = tmp_path / "pos.jsonl"
  tags.write_text(json.dumps({"words": ["I", "run"], "tags": ["PRON", "VERB"]}) + "\n")
  ex = file_task.read_split(file_task.FileTask(("words",), "tags",
                                               "token_classification"), str(tags))
  assert ex.words == [["I", "run"]] and ex.labels == [[0, 1]]
  scores = tmp_path / "sts.tsv"
  scores.write_text("a\tb\tscore\nx\ty\t4.5\n")
  ex = file_task.read_split(file_task.FileTask(("a", "b"), "score", "regression"),
                            str(scores))
  assert ex.labels == [4.5] and ex.label_names is None


@pytest.mark.parametrize("name, content, message", [
    ("dev.csv", "text,label\nok,pos\nmeh,neutral\n", r"dev\.csv:3: unknown label 'neutral'"),
    ("dev.csv", "text,label\nok,pos\nmeh\n",
     r"dev\.csv:3: 1 columns, the header has 2"),
    ("dev.csv", 'text,label\nok,pos\n"  ",neg\n', r"dev\.csv:3: empty text in field 'text'"),
    ("dev.csv", 'text,label\n"a\nb, c",pos\nok,\xff\n', r"dev\.csv:4: not valid utf-8"),
    ("dev.jsonl", '{"text": "ok", "label": "pos"}\n{"label": "neg"}\n',
     r"dev\.jsonl:2: no field 'text'"),
    ("dev.jsonl", '{"text": "ok", "label": "pos"}\n{"text": "\xff", "label": "neg"}\n',
     r"dev\.jsonl:2: not valid utf-8"),
    ("dev.jsonl", '{"text": "ok", "label": "pos"}\n{"text": "x"\n',
     r"dev\.jsonl:2: malformed JSON"),
])
def test_every_bad_row_names_file_and_line_or_is_skipped_and_counted(
    tmp_path, name, content, message):
  path = tmp_path / name
  # \xff stands for a byte that is not UTF-8.
  path.write_bytes(content.encode("utf-8").replace(b"\xc3\xbf", b"\xff"))
  labels = ("neg", "pos")
  with pytest.raises(ValueError, match=message):
    file_task.read_split(TEXT, str(path), labels)
  ex = file_task.read_split(TEXT, str(path), labels, on_error="skip")
  first = 1 if name.endswith(".jsonl") else 2  # a table's line 1 is its header
  assert len(ex) == 1 and ex.skipped == 1 and ex.lines == [f"{path}:{first}"]


def test_labels_outside_the_head_are_errors_naming_the_line(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text("text,label\na,1\nb,5\n")
  given = file_task.FileTask(("text",), "label", labels=("1", "2", "3", "4"))
  with pytest.raises(ValueError, match=r"t\.csv:3: unknown label '5'"):
    file_task.read_split(given, str(path))
  # Class ids made in Python are checked too: 4 of 4 classes, -1, True.
  for bad in (4, -1, True):
    with pytest.raises(ValueError, match=rf"x\.tsv:7: label {bad!r} is not a class id"):
      Examples(["a"], [bad], ("a", "b", "c", "d"), lines=["x.tsv:7"])
  with pytest.raises(ValueError, match=r"f: example 1: label 9"):
    Examples(["a", "b"], [[0], [9]], ("A", "B"), words=[["a"], ["b"]], path="f")


def test_dev_and_test_are_held_out_of_train_by_seed(tmp_path):
  path = tmp_path / "all.csv"
  path.write_text("text,label\n" + "".join(f"t{i},{i % 3}\n" for i in range(20)))
  config = _config("--config=configs/finetune.py:task=files",
                   f"--config.task.train={path}", "--config.task.dev_fraction=0.2",
                   "--config.task.test_fraction=0.25")
  splits = finetune.load_task_splits(_task(config), seed=0)
  sizes = {k: len(v) for k, v in splits.items()}
  assert sizes == {"train": 12, "dev": 3, "test": 5}
  texts = [t for ex in splits.values() for t in ex.texts]
  assert sorted(texts) == sorted(f"t{i}" for i in range(20))
  again = finetune.load_task_splits(_task(config), seed=0)
  assert again["test"].texts == splits["test"].texts
  assert finetune.load_task_splits(_task(config), seed=1)["test"].texts != \
      splits["test"].texts


def test_sst2_through_the_generic_task_equals_the_builtin_reader():
  """Dev only (train, 67k rows, goes through the same reader: test_real_glue)."""
  dev = datadir.require_data("glue", "SST-2", "dev.tsv")
  files = _config("--config=configs/finetune.py:task=files", f"--config.task.train={dev}",
                  f"--config.task.dev={dev}", "--config.task.text_fields=('sentence',)")
  generic = finetune.load_task_splits(_task(files), 0)["dev"]
  known = readers.load_task("sst2", "dev")
  assert (generic.texts, generic.labels) == (known.texts, known.labels)
  assert len(known) == 872 and generic.label_names == ("0", "1")  # the file's labels


def test_unknown_format_and_missing_train_are_clear(tmp_path):
  with pytest.raises(ValueError, match="cannot tell the format"):
    list(row_files.read_rows(str(tmp_path / "data.txt")))
  with pytest.raises(ValueError, match="unknown format 'xlsx'"):
    row_files.format_of("a.csv", "xlsx")
  config = _config("--config=configs/finetune.py:task=files")
  with pytest.raises(ValueError, match="task.train=PATH"):
    finetune.load_task_splits(_task(config), 0)


# --- Fine-tuning with no Python ----------------------------------------------

def _text(i: int) -> str:
  return f"{_WORDS[i % 6]} film, {_WORDS[(i * 7) % 6]} cast"


@pytest.mark.slow
def test_a_csv_with_string_labels_fine_tunes_and_predicts_its_labels(
    vocab, tmp_path, monkeypatch):
  train_path = tmp_path / "train.csv"
  rows = "".join(f'"{_text(i)}",{("sad", "happy")[i % 2]}\n' for i in range(24))
  long = " ".join(["word"] * 40)
  train_path.write_text(f"review,mood\n{rows}{long},happy\nno label here\n")
  dev = tmp_path / "dev.csv"
  dev.write_text("review,mood\ngood film,happy\nbad film,sad\nodd,angry\n")
  predicted, predict = [], finetune.inference.predict
  monkeypatch.setattr(finetune.inference, "predict", lambda *a, desc, **k: (
      predicted.append(desc), predict(*a, desc=desc, **k))[1])
  results = _finetune(vocab, tmp_path / "w", f"--config.task.train={train_path}",
                      f"--config.task.dev={dev}", "--config.task.text_fields=('review',)",
                      "--config.task.label_field=mood", "--config.task.on_error=skip",
                      "--config.train.epochs=2")
  assert set(results["test"]) == {"accuracy", "macro_f1"}
  # No test file: dev is reported as test, with the scores that chose the
  # state (the first epoch of the best), not predicted a second time.
  chosen = max(results["history"], key=lambda h: h["accuracy"])
  assert results["test"] == {k: chosen[k] for k in results["test"]}
  assert predicted == ["dev", "dev"]
  train = results["data"]["train"]
  assert {k: train[k] for k in ("examples", "skipped_rows", "truncated")} == {
      "examples": 25, "skipped_rows": 1, "truncated": 1}
  assert len(train["skipped"]) == 1, train["skipped"]
  assert train["skipped"][0].startswith(f"{train_path}:27: ")  # file:line: reason
  assert results["data"]["dev"]["skipped_rows"] == 1  # the unknown label
  assert results["data"]["dev"]["skipped"][0].startswith(f"{dev}:4: ")
  preds = jaxtl.load(str(tmp_path / "w")).predict(["good film"])
  assert set(preds[0]["probabilities"]) == {"happy", "sad"}


@pytest.mark.slow
def test_jsonl_integer_labels_parquet_and_a_pair_tsv_fine_tune(vocab, tmp_path):
  pq = pytest.importorskip("pyarrow.parquet")
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  jsonl = tmp_path / "stars.jsonl"
  jsonl.write_text("".join(json.dumps({"body": _text(i), "stars": 1 + i % 4}) + "\n"
                           for i in range(32)))
  results = _finetune(vocab, tmp_path / "j", f"--config.task.train={jsonl}",
                      "--config.task.dev_fraction=0.25", "--config.task.test_fraction=0.25",
                      "--config.task.text_fields=('body',)", "--config.task.label_field=stars")
  assert results["data"]["test"]["examples"] == 8 and "accuracy" in results["test"]
  assert jaxtl.load(str(tmp_path / "j")).spec.label_names == ("1", "2", "3", "4")
  table = tmp_path / "t.parquet"
  pq.write_table(pa.table({"text": [_text(i) for i in range(16)],
                           "label": ["a", "b"] * 8}), str(table))
  results = _finetune(vocab, tmp_path / "p", f"--config.task.train={table}",
                      f"--config.task.test={table}", "--config.task.dev_fraction=0")
  assert results["best_dev"] is None and "accuracy" in results["test"]
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("premise\thypothesis\tgold\n" + "".join(
      f"{_text(i)}\t{_text(i + 1)}\t{('yes', 'no')[i % 2]}\n" for i in range(16)))
  results = _finetune(vocab, tmp_path / "s", f"--config.task.train={pairs}",
                      f"--config.task.dev={pairs}",
                      "--config.task.text_fields=('premise', 'hypothesis')",
                      "--config.task.label_field=gold")
  assert "accuracy" in results["test"]
  assert jaxtl.load(str(tmp_path / "s")).spec.is_pair


def _saved_hf_dataset(tmp_path):
  """A save_to_disk folder with a ClassLabel whose ids are not sorted names."""
  datasets = pytest.importorskip("datasets")
  features = datasets.Features({
      "premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
      "label": datasets.ClassLabel(names=["yes", "no"])})
  split = lambda n, k: datasets.Dataset.from_dict(
      {"premise": [_text(i) for i in range(k, k + n)],
       "hypothesis": [_text(i + 1) for i in range(k, k + n)],
       "label": [i % 2 for i in range(k, k + n)]}, features=features)
  folder = tmp_path / "nli"
  datasets.DatasetDict({"train": split(16, 0), "validation": split(8, 16)}).save_to_disk(
      str(folder))
  return folder


def test_a_hugging_face_dataset_is_a_file_task_with_its_classlabel_order(tmp_path,
                                                                       monkeypatch):
  folder = _saved_hf_dataset(tmp_path)
  config = _config("--config=configs/finetune.py:task=files", "--config.task.format=hf",
                   f"--config.task.hf.name={folder}", "--config.task.dev=validation",
                   "--config.task.text_fields=('premise', 'hypothesis')")
  splits = finetune.load_task_splits(_task(config), 0)
  assert {k: len(v) for k, v in splits.items()} == {"train": 16, "dev": 8, "test": 8}
  assert splits["train"].label_names == ("yes", "no")  # the dataset's ids, not sorted
  assert splits["train"].labels[:2] == [0, 1] and splits["dev"].text_pairs
  assert splits["dev"].lines[0] == f"{folder} validation row 0"
  config.task.hf.name = ""
  with pytest.raises(ValueError, match="task.hf.name"):
    finetune.load_task_splits(_task(config), 0)
  # A Hub name offline: the message names this task's flags.
  config.task.hf.update(name="glue", subset="sst2", cache_dir=str(tmp_path / "cache"))
  monkeypatch.setattr(pytest.importorskip("datasets").config, "HF_HUB_OFFLINE", True)
  with pytest.raises(ConnectionError, match=r"pass --config.task.hf.name=FOLDER, or "
                                            r"pass --config.task.hf.cache_dir=CACHE"):
    finetune.load_task_splits(_task(config), 0)


@pytest.mark.slow  # a fine-tuning run: 11 s once no other test has compiled it
def test_a_saved_hugging_face_dataset_fine_tunes(vocab, tmp_path):
  folder = _saved_hf_dataset(tmp_path)
  results = _finetune(vocab, tmp_path / "h", "--config.task.format=hf",
                      f"--config.task.hf.name={folder}", "--config.task.dev=validation",
                      "--config.task.text_fields=('premise', 'hypothesis')")
  assert "accuracy" in results["test"] and results["data"]["train"]["examples"] == 16
  assert jaxtl.load(str(tmp_path / "h")).spec.label_names == ("yes", "no")


def test_a_field_over_128_kib_is_a_text_and_an_empty_split_names_its_file(tmp_path):
  path = tmp_path / "long.csv"
  path.write_text("text,label\na,x\n" + "b" * 200_000 + ",y\n")
  assert [len(t) for t in file_task.read_split(TEXT, str(path)).texts] == [1, 200_000]
  header_only = tmp_path / "dev.csv"
  header_only.write_text("text,label\n")
  with pytest.raises(ValueError, match=rf"{header_only}: no usable rows"):
    file_task.read_split(TEXT, str(header_only), ("x", "y"))


@pytest.mark.parametrize("files, fractions, present, note", [
    (("train",), (0.0, 0.0), {"train"}, "no dev or test split: the last epoch is the model"),
    (("train",), (0.25, 0.0), {"train", "dev", "test=dev"},
     "no test split: the dev split's scores are reported as the test's (add "
     "--config.task.test=FILE or --config.task.test_fraction=0.1)"),
    (("train",), (0.25, 0.25), {"train", "dev", "test"}, None),
    (("train", "test"), (0.0, 0.0), {"train", "test"},
     "no dev split: the last epoch is the model (add --config.task.dev=FILE"),
    (("train", "dev"), (0.0, 0.0), {"train", "dev", "test=dev"}, "no test split"),
    (("train", "dev", "test"), (0.0, 0.0), {"train", "dev", "test"}, None),
])
def test_every_combination_of_files_and_fractions_says_what_it_lacks(
    tmp_path, files, fractions, present, note):
  path = tmp_path / "rows.csv"
  path.write_text("text,label\n" + "".join(f"{w} film,{w}\n" for w in _WORDS * 4))
  config = _config("--config=configs/finetune.py:task=files",
                   *(f"--config.task.{name}={path}" for name in files),
                   f"--config.task.dev_fraction={fractions[0]}",
                   f"--config.task.test_fraction={fractions[1]}")
  splits = finetune.load_task_splits(_task(config), config.seed)
  held = {name for name in ("train", "dev") if splits[name] is not None}
  if splits["test"] is not None:
    held.add("test=dev" if splits["test"] is splits["dev"] else "test")
  assert held == present
  said = finetune.splits_note(_task(config), splits)
  assert said is None if note is None else said.startswith(note), said


@pytest.mark.slow
def test_one_file_alone_trains_and_predict_reads_its_columns(vocab, tmp_path):
  """With a train file only (and no held-out share) the run once trained
  fully, then died on KeyError: 'test' with no results.json; predict then
  needed --text_fields for the column it was trained on."""
  path = tmp_path / "messages.csv"
  path.write_text("message,category\n" + "".join(f"{w} film,{w}\n" for w in _WORDS * 4))
  results = _finetune(vocab, tmp_path / "w", f"--config.task.train={path}",
                      "--config.task.dev_fraction=0", "--config.task.text_fields=('message',)",
                      "--config.task.label_field=category")
  assert results["test"] is None and results["best_dev"] is None
  assert results["history"][0]["train_loss"] > 0
  assert json.loads((tmp_path / "w" / "results.json").read_text())["test"] is None
  records = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").open()]
  train = [r for r in records if r["split"] == "train"]
  assert train and all("perplexity" not in r for r in train)  # a class distribution's
  from jaxtl.tasks import file_predictions as predict  # pylint: disable=g-import-not-at-top
  out = tmp_path / "out.jsonl"
  assert predict.predict_file(str(tmp_path / "w"), str(path), str(out)) == 24
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert rows[0]["message"] == "good film" and rows[0]["label"] in _WORDS
