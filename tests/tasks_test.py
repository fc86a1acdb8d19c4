"""Tests for jaxtl.tasks.readers: synthetic error paths, then the real files."""

from __future__ import annotations

import collections
import gzip
import json

import pytest

import datadir
from jaxtl.tasks import metrics as evaluate
from jaxtl.tasks import squad as squad_lib
from jaxtl.tasks import readers as tasks
from jaxtl.tasks.examples import Examples


def _write(root, rel, text, encoding="utf-8"):
  path = root.joinpath(*rel.split("/"))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(text.encode(encoding))
  return path


def _real_root(*parts):
  datadir.require_data(*parts)  # Skips when absent.
  return str(datadir.data_dir())


# --- Shared behaviour --------------------------------------------------------


def test_bad_arguments(tmp_path, monkeypatch):
  _write(tmp_path, "trec/TREC_10.label", "NUM:date When ?\n")
  with pytest.raises(ValueError, match="on_error"):
    tasks.read_trec("test", tmp_path, on_error="ignore")
  with pytest.raises(ValueError, match="splits train, test"):
    tasks.read_trec("dev", tmp_path)
  with pytest.raises(FileNotFoundError, match="train_5500"):
    tasks.read_trec("train", tmp_path)
  with pytest.raises(ValueError, match="unknown task"):
    tasks.load_task("mnli", "train", tmp_path)
  with pytest.raises(ValueError, match="unknown GLUE task"):
    tasks.read_glue("qqp", "train", tmp_path)
  monkeypatch.delenv("JAXTL_DATA_DIR", raising=False)
  with pytest.raises(ValueError, match="JAXTL_DATA_DIR"):
    tasks.read_trec("test")
  monkeypatch.setenv("JAXTL_DATA_DIR", str(tmp_path))
  assert tasks.read_trec("test").labels == [tasks.TREC_LABELS.index("NUM")]


def test_every_task_has_metrics_and_an_eval_split():
  assert set(tasks.TASK_SPLITS) == set(evaluate.TASK_METRICS)
  for task, split in tasks.EVAL_SPLITS.items():
    assert split in tasks.TASK_SPLITS[task]
  assert set(tasks.EVAL_SPLITS) == set(tasks.TASK_SPLITS)


# --- TREC --------------------------------------------------------------------


def test_trec_parses_latin1(tmp_path):
  _write(tmp_path, "trec/train_5500.label",
         "DESC:manner How did it go ?\n\nLOC:city Which sister\xf0city ?\n",
         encoding="latin-1")
  ex = tasks.read_trec("train", tmp_path)
  assert ex.texts == ["How did it go ?", "Which sister\xf0city ?"]
  assert [ex.label_names[i] for i in ex.labels] == ["DESC", "LOC"]
  assert ex.text_pairs is None and ex.skipped == 0


@pytest.mark.parametrize("line, message", [
    ("FOO:bar What is it ?", r"train_5500\.label:2: unknown label 'FOO'"),
    ("DESCmanner What is it ?", r"train_5500\.label:2: expected 'COARSE"),
    ("DESC: What is it ?", r"train_5500\.label:2: expected 'COARSE"),
    ("DESC:manner", r"train_5500\.label:2: empty question"),
    ("DESC:manner   ", r"train_5500\.label:2: empty question"),
])
def test_trec_errors_name_file_and_line(tmp_path, line, message):
  _write(tmp_path, "trec/train_5500.label", f"NUM:date When ?\n{line}\n")
  with pytest.raises(ValueError, match=message):
    tasks.read_trec("train", tmp_path)


def test_trec_skip_mode_counts(tmp_path):
  _write(tmp_path, "trec/train_5500.label",
         "NUM:date When ?\nFOO:x Y ?\n\nHUM:ind Who ?\nbad\nDESC:def\n")
  ex = tasks.read_trec("train", tmp_path, on_error="skip")
  assert ex.texts == ["When ?", "Who ?"]
  assert ex.skipped == 3
  assert [m.split(": ")[0].rsplit(":", 1)[1] for m in ex.skipped_rows] == [
      "2", "5", "6"]


# --- GLUE --------------------------------------------------------------------


def test_glue_formats(tmp_path):
  _write(tmp_path, "glue/CoLA/train.tsv",
         "gj04\t1\t\tGood one.\ngj04\t0\t*\tBad \"one.\n")
  _write(tmp_path, "glue/MRPC/dev.tsv",
         "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
         "1\t1\t2\tA \" b .\tA b .\n")
  # STS-B columns are found by header name, whatever their position.
  _write(tmp_path, "glue/STS-B/train.tsv",
         "score\tsentence2\tx\tsentence1\n2.500\tTwo\t-\tOne\n")
  _write(tmp_path, "glue/RTE/dev.tsv",
         "index\tsentence1\tsentence2\tlabel\n0\tP\tH\tnot_entailment\n")
  cola = tasks.read_glue("cola", "train", tmp_path)
  assert cola.texts == ["Good one.", "Bad \"one."] and cola.labels == [1, 0]
  assert cola.label_names == ("unacceptable", "acceptable")
  mrpc = tasks.read_glue("mrpc", "dev", tmp_path)
  assert (mrpc.texts, mrpc.text_pairs, mrpc.labels) == (
      ["A \" b ."], ["A b ."], [1])
  stsb = tasks.read_glue("stsb", "train", tmp_path)
  assert (stsb.texts, stsb.text_pairs, stsb.labels) == (["One"], ["Two"],
                                                        [2.5])
  assert stsb.label_names is None
  rte = tasks.read_glue("rte", "dev", tmp_path)
  assert rte.labels == [1] and rte.label_names[1] == "not_entailment"


@pytest.mark.parametrize("task, row, message", [
    ("sst2", "fine\t2", r"train\.tsv:3: unknown label '2'"),
    ("sst2", "fine", r"train\.tsv:3: 1 columns, the header has 2"),
    ("sst2", " \t1", r"train\.tsv:3: empty text"),
    ("rte", "1\tP\tH\tentails", r"train\.tsv:3: unknown label 'entails'"),
    ("rte", "1\tP\t\tentailment", r"train\.tsv:3: empty text"),
    ("stsb", "A\tB\t5.5", r"train\.tsv:3: score 5\.5 outside"),
    ("stsb", "A\tB\thigh", r"train\.tsv:3: score 'high' is not a number"),
    ("cola", "src\t1\t\tok", None),  # Checked separately (no header).
])
def test_glue_errors_name_file_and_line(tmp_path, task, row, message):
  headers = {"sst2": ("SST-2", "sentence\tlabel", "ok\t1"),
             "rte": ("RTE", "index\tsentence1\tsentence2\tlabel",
                     "0\tP\tH\tentailment"),
             "stsb": ("STS-B", "sentence1\tsentence2\tscore", "A\tB\t1.0"),
             "cola": ("CoLA", "src\t1\t\tok", "src\t0\t*\tbad")}
  folder, first, second = headers[task]
  _write(tmp_path, f"glue/{folder}/train.tsv", f"{first}\n{second}\n{row}\n")
  if message is None:
    assert len(tasks.read_glue(task, "train", tmp_path)) == 3
    return
  with pytest.raises(ValueError, match=message):
    tasks.read_glue(task, "train", tmp_path)
  ex = tasks.read_glue(task, "train", tmp_path, on_error="skip")
  assert len(ex) == 1 and ex.skipped == 1


def test_glue_cola_errors_and_decoding(tmp_path):
  _write(tmp_path, "glue/CoLA/dev.tsv", "s\t1\t\tok\ns\t1\tonly three\n")
  with pytest.raises(ValueError, match=r"dev\.tsv:2: 3 columns, the header has 4"):
    tasks.read_glue("cola", "dev", tmp_path)
  path = _write(tmp_path, "glue/SST-2/dev.tsv", "sentence\tlabel\nok\t1\n")
  path.write_bytes(path.read_bytes() + b"caf\xe9\t1\nfine\t0\n")
  with pytest.raises(ValueError, match=r"dev\.tsv:3: not valid utf-8"):
    tasks.read_glue("sst2", "dev", tmp_path)
  ex = tasks.read_glue("sst2", "dev", tmp_path, on_error="skip")
  assert ex.texts == ["ok", "fine"] and ex.skipped == 1


def test_glue_missing_header_column(tmp_path):
  _write(tmp_path, "glue/SST-2/train.tsv", "text\tlabel\nok\t1\n")
  with pytest.raises(ValueError, match=r"train\.tsv:1: no column 'sentence'"):
    tasks.read_glue("sst2", "train", tmp_path)


# --- IMDB --------------------------------------------------------------------


def _write_imdb(root, lines):
  path = root / "imdb" / "test.jsonl.gz"
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))


def test_imdb_reads_and_errors(tmp_path):
  good = [json.dumps({"text": "Great<br />film", "label": 1, "id": 0}),
          json.dumps({"text": "Dull", "label": 0, "id": 1})]
  _write_imdb(tmp_path, good)
  ex = tasks.read_imdb("test", tmp_path)
  assert ex.texts == ["Great<br />film", "Dull"] and ex.labels == [1, 0]
  for bad, message in [
      (json.dumps({"text": "x", "label": -1}), "unknown label -1"),
      (json.dumps({"text": "x", "label": True}), "label True is not a class"),
      (json.dumps({"text": " ", "label": 1}), "empty text"),
      ("{not json", "malformed JSON")]:
    _write_imdb(tmp_path, good + [bad])
    with pytest.raises(ValueError, match=rf"test\.jsonl\.gz:3: {message}"):
      tasks.read_imdb("test", tmp_path)
    skipped = tasks.read_imdb("test", tmp_path, on_error="skip")
    assert len(skipped) == 2 and skipped.skipped == 1
  with pytest.raises(ValueError, match="splits train, test"):
    tasks.read_imdb("unsup", tmp_path)


# --- CoNLL-U -----------------------------------------------------------------

_CONLLU = """\
# sent_id = a
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
3.1\tknow\tknow\tVERB\t_\t_\t_\t_\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = b
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""  # No blank line after the last sentence: still read.


def test_conllu_words_and_tags(tmp_path):
  path = _write(tmp_path, "x.conllu", _CONLLU)
  ex = tasks.read_conllu(path)
  assert ex.words == [["I", "do", "n't", "know", "."], ["Hi"]]
  assert ex.texts == ["I do n't know .", "Hi"]
  assert [[tasks.UPOS_TAGS[t] for t in s] for s in ex.labels] == [
      ["PRON", "AUX", "PART", "VERB", "PUNCT"], ["INTJ"]]
  assert len(tasks.UPOS_TAGS) == len(set(tasks.UPOS_TAGS)) == 17


@pytest.mark.parametrize("old, new, message", [
    ("\tPART\t", "\tPARTICLE\t", r"x\.conllu:6: unknown UPOS tag 'PARTICLE'"),
    ("4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_", "4\tknow\tVERB",
     r"x\.conllu:8: expected 10 tab-separated fields, got 3"),
    ("5\t.\t", "6\t.\t", r"x\.conllu:9: word id '6' where 5 was expected"),
    ("1\tHi\t", "1\t \t", r"x\.conllu:12: empty word form"),
])
def test_conllu_errors_and_skip(tmp_path, old, new, message):
  assert old in _CONLLU
  path = _write(tmp_path, "x.conllu", _CONLLU.replace(old, new, 1))
  with pytest.raises(ValueError, match=message):
    tasks.read_conllu(path)
  ex = tasks.read_conllu(path, on_error="skip")
  assert len(ex) == 1 and ex.skipped == 1  # The whole sentence, once.


def test_conllu_skip_counts_each_bad_sentence_once(tmp_path):
  text = _CONLLU.replace("\tAUX\t", "\tBAD\t").replace("\tPART\t", "\tBAD\t")
  path = _write(tmp_path, "x.conllu", text)
  ex = tasks.read_conllu(path, on_error="skip")
  assert ex.words == [["Hi"]] and ex.skipped == 1
  assert ":5: unknown UPOS tag 'BAD'" in ex.skipped_rows[0]


# --- SQuAD -------------------------------------------------------------------


def _squad_json(num_articles=4, bad_start=False):
  articles = []
  for a in range(num_articles):
    context = f"Article {a} says the answer is blue."
    start = context.index("blue") + (1 if bad_start and a == 1 else 0)
    qas = [{"id": f"{a}-{q}", "question": f"Q{q}?",
            "answers": [{"text": "blue", "answer_start": start}]}
           for q in range(3)]
    articles.append({"title": f"T{a}",
                     "paragraphs": [{"context": context, "qas": qas}]})
  return {"version": "1.1", "data": articles}


def test_squad_reads_and_errors(tmp_path):
  path = tmp_path / "s.json"
  path.write_text(json.dumps(_squad_json()), encoding="utf-8")
  ex = squad_lib.read_squad_json(path)
  assert len(ex) == 12 and ex.skipped == 0
  first = ex[0]
  assert (first.id, first.title, first.question) == ("0-0", "T0", "Q0?")
  assert first.context[first.answers[0].start:first.answers[0].end] == "blue"
  path.write_text(json.dumps(_squad_json(bad_start=True)), encoding="utf-8")
  with pytest.raises(ValueError,
                     match=r"s\.json: article 1 \('T1'\), question '1-0': "
                     r"answer 'blue' is not at character"):
    squad_lib.read_squad_json(path)
  ex = squad_lib.read_squad_json(path, on_error="skip")
  assert len(ex) == 9 and ex.skipped == 3
  path.write_text('{"data": [\n{"title": }', encoding="utf-8")
  with pytest.raises(ValueError, match=r"s\.json:2:\d+: malformed JSON"):
    squad_lib.read_squad_json(path)


def test_squad_duplicate_id_and_empty_question(tmp_path):
  data = _squad_json(num_articles=2)
  data["data"][1]["paragraphs"][0]["qas"][0]["id"] = "0-0"
  data["data"][1]["paragraphs"][0]["qas"][1]["question"] = " "
  path = tmp_path / "s.json"
  path.write_text(json.dumps(data), encoding="utf-8")
  with pytest.raises(ValueError, match="duplicate question id"):
    squad_lib.read_squad_json(path)
  ex = squad_lib.read_squad_json(path, on_error="skip")
  assert len(ex) == 4 and ex.skipped == 2
  assert "empty question" in ex.skipped_rows[1]


def test_split_squad_by_article(tmp_path):
  path = tmp_path / "s.json"
  path.write_text(json.dumps(_squad_json(num_articles=8)), encoding="utf-8")
  ex = squad_lib.read_squad_json(path)
  train, held_out = tasks.split_squad_by_article(ex)
  assert len({e.title for e in held_out}) == 2  # 25% of 8 articles.
  assert not {e.title for e in train} & {e.title for e in held_out}
  assert len(train) + len(held_out) == len(ex)
  assert train == [e for e in ex if e in train]  # Order kept.
  assert tasks.split_squad_by_article(ex) == (train, held_out)
  splits = {tuple(sorted({e.title for e in tasks.split_squad_by_article(
      ex, seed=s)[1]})) for s in range(10)}
  assert len(splits) > 1  # The seed matters.
  assert len({e.title for e in tasks.split_squad_by_article(
      ex, eval_fraction=0.01)[1]}) == 1  # At least one article.
  with pytest.raises(ValueError, match="eval_fraction"):
    tasks.split_squad_by_article(ex, eval_fraction=1.0)


# --- Real data ---------------------------------------------------------------


def test_real_trec():
  root = _real_root("trec")
  train, test = tasks.read_trec("train", root), tasks.read_trec("test", root)
  assert (len(train), len(test)) == (5452, 500)
  for ex in (train, test):
    assert set(ex.labels) == set(range(6))
  counts = collections.Counter(train.label_names[i] for i in train.labels)
  assert counts == {"ENTY": 1250, "HUM": 1223, "DESC": 1162, "NUM": 896,
                    "LOC": 835, "ABBR": 86}
  # Line 66 holds the file's one non-UTF-8 byte (0xF0, read as Latin-1).
  assert "sister\xf0city" in train.texts[65]


@pytest.mark.parametrize("task, sizes, pairs", [
    ("sst2", (67349, 872), False),
    ("cola", (8551, 1043), False),
    ("mrpc", (3667, 408), True),
    ("rte", (2490, 277), True),
    ("stsb", (5749, 1500), True),
])
def test_real_glue(task, sizes, pairs):
  root = _real_root("glue")
  train, dev = (tasks.read_glue(task, s, root) for s in ("train", "dev"))
  assert (len(train), len(dev)) == sizes
  for ex in (train, dev):
    assert (ex.text_pairs is not None) == pairs
    assert all(t.strip() for t in ex.texts)
    if task == "stsb":
      assert all(0.0 <= s <= 5.0 for s in ex.labels)
      assert min(ex.labels) == 0.0 and max(ex.labels) == 5.0
    else:
      assert set(ex.labels) == {0, 1}


def test_real_imdb():
  root = _real_root("imdb")
  for split in ("train", "test"):
    ex = tasks.read_imdb(split, root)
    assert len(ex) == 25000 and sum(ex.labels) == 12500


def test_real_ud_ewt():
  root = _real_root("ud_ewt")
  sizes = {s: len(tasks.read_ud_pos(s, root)) for s in ("dev", "test")}
  assert sizes == {"dev": 2001, "test": 2077}
  train = tasks.read_ud_pos("train", root)
  assert len(train) == 12544
  used = set()
  for words, tags in zip(train.words, train.labels):
    assert len(words) == len(tags) > 0
    used.update(tags)
  assert used == set(range(17))  # Every UPOS tag occurs in train.


def test_real_squad():
  root = _real_root("squad")
  ex = tasks.read_squad("dev", root)
  assert len(ex) == 10570 and ex.skipped == 0
  assert len({e.title for e in ex}) == 48
  assert len({e.id for e in ex}) == 10570
  train, held_out = tasks.split_squad_by_article(ex)
  train_titles = {e.title for e in train}
  eval_titles = {e.title for e in held_out}
  assert not train_titles & eval_titles
  assert (len(train_titles), len(eval_titles)) == (36, 12)
  assert len(train) + len(held_out) == 10570
  loaded = tasks.load_task("squad", "eval", root)
  assert [e.id for e in loaded] == [e.id for e in held_out]
  gold = {e.id: e.answers[0].text for e in held_out}
  assert evaluate.squad_metrics(gold, held_out) == {"exact_match": 100.0,
                                                    "f1": 100.0}


def test_a_sample_is_seeded_in_file_order_and_keeps_the_skipped_rows():
  ex = Examples([f"t{i}" for i in range(10)], [0] * 5 + [1] * 5, ("a", "b"),
                skipped_rows=["f:3: empty text"])
  got = ex.sample(4, 0)
  assert len(got) == 4 and got.texts == sorted(got.texts, key=lambda t: int(t[1:]))
  assert got.texts == ex.sample(4, 0).texts != ex.sample(4, 1).texts
  assert got.skipped_rows == ["f:3: empty text"] and ex.sample(20, 0) is ex
