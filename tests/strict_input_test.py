"""Rows are read strictly and written whole (issue 28): a broken quote, a
column named twice, one number spelled two ways, a blank line, a later
row's extra field or a byte that is not UTF-8 never costs a row silently.

Readers and writers are tested directly: no model is trained here (the
predict CLI end to end is predict_test's)."""

from __future__ import annotations

import csv
import json
import os

import pytest

from jaxtl.tasks import file_predictions as predict
from jaxtl.tasks import file_task, rows

TEXT = file_task.FileTask(("text",), "label")


def _write(path, content: str | bytes):
  path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
  return str(path)


# --- A. Strict CSV -------------------------------------------------------------


@pytest.mark.parametrize("content", [
    # Never closed: the field would swallow the rest of the file.
    'text,label\na,pos\n"unclosed,neg\nb,pos\nc,neg\nd,pos\ne,neg\nf,pos\n',
    # Closed lines later by a quote that opened a field of its own.
    'text,label\na,pos\n"unclosed,neg\nb,pos\n"c",neg\nd,pos\n',
])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_unbalanced_quote_stops_the_read_at_its_line_even_when_skipping(
    tmp_path, content, on_error):
  path = _write(tmp_path / "q.csv", content)
  with pytest.raises(ValueError, match=r"q\.csv:3: a quoted field .* not closed .*"
                     r"the rest of the file cannot be read"):
    file_task.read_split(TEXT, path, on_error=on_error)


def test_predict_input_is_strict_and_unquoted_tsv_keeps_its_quotes(tmp_path):
  path = _write(tmp_path / "in.tsv", 'id\ttext\n1\t"Who?\n2\tWhere?\n')
  with pytest.raises(ValueError, match=r"in\.tsv:2: .*tsv_unquoted \(--config.task.format="
                                       r"tsv_unquoted; jaxtl predict: --input_format="):
    rows.read_rows(path)
  assert [r["text"] for _, r in rows.read_rows(path, "tsv_unquoted")] == ['"Who?', "Where?"]
  # ... which predict's --input_format offers, as every format the readers have.
  from absl import flags  # pylint: disable=g-import-not-at-top
  from jaxtl.data import row_files  # pylint: disable=g-import-not-at-top
  from jaxtl.programs import predict as command  # pylint: disable=g-import-not-at-top
  del command  # its flags, defined on import
  assert set(flags.FLAGS["input_format"].parser.enum_values) == {"", "text", *row_files.READERS}
  # IANA TSV (GLUE): quotes are plain characters, and a stray one is text.
  glue = file_task.FileTask(("sentence",), "label", format="tsv_unquoted")
  path = _write(tmp_path / "glue.tsv", 'sentence\tlabel\n"a quote\t1\nb "c" d\t0\n')
  assert file_task.read_split(glue, path).texts == ['"a quote', 'b "c" d']


# --- B. A column named twice -----------------------------------------------------


def test_a_column_named_twice_is_refused(tmp_path):
  path = _write(tmp_path / "dup.csv", "text,label,text\ngood,pos,bad\n")
  with pytest.raises(ValueError, match=r"dup\.csv:1: column 'text' appears twice "
                     r"in the header"):
    file_task.read_split(TEXT, path)
  with pytest.raises(ValueError, match=r"dup\.csv:1: column 'text' appears twice"):
    rows.read_rows(path)  # prediction input too
  # Unnamed columns (a spreadsheet's trailing empty ones) are never read.
  path = _write(tmp_path / "padded.csv", "text,label,,\ngood,pos,,\n")
  assert file_task.read_split(TEXT, path).texts == ["good"]
  with pytest.raises(ValueError, match=r"columns=\('a', 'a'\) name a column twice"):
    file_task.FileTask(("a",), "b", columns=("a", "a"))


# --- C. Labels ---------------------------------------------------------------------


@pytest.mark.parametrize("first, second", [(1, "01"), ("1", "1.0"), (1, "1e0")])
def test_one_number_spelled_two_ways_is_refused_at_the_second(tmp_path, first, second):
  path = _write(tmp_path / "l.jsonl", "".join(
      json.dumps({"text": t, "label": v}) + "\n"
      for t, v in [("a", first), ("b", 2), ("c", second)]))
  with pytest.raises(ValueError, match=rf"l\.jsonl:3: label '{second}' is the label "
                     r"'1' spelled another way"):
    file_task.read_split(TEXT, path)
  ex = file_task.read_split(TEXT, path, on_error="skip")
  assert ex.label_names == ("1", "2") and ex.skipped == 1
  # Against train's labels (dev, test), the same message.
  dev = file_task.read_split(TEXT, path, ("1", "2"), on_error="skip")
  assert "spelled another way" in dev.skipped_rows[0]


def test_text_labels_are_their_stripped_text(tmp_path):
  path = _write(tmp_path / "t.csv", "text,label\na, pos \nb,Pos\nc,7\nd,pos\n")
  ex = file_task.read_split(TEXT, path)
  assert ex.label_names == ("7", "Pos", "pos") and ex.labels == [2, 1, 0, 2]
  assert file_task.label_key(7) == file_task.label_key(" 7 ") == "7"
  assert file_task.label_key("07") == "07"  # spelled as written (refused beside 7)


# --- D. Prediction input and output --------------------------------------------


def test_every_input_line_is_a_row_and_the_last_newline_is_none(tmp_path):
  text = _write(tmp_path / "in.txt", "Who?\n\nWhere?\n  \nWhen?\n")
  assert [(i, r["text"]) for i, r in rows.read_rows(text)] == [
      (1, "Who?"), (2, ""), (3, "Where?"), (4, "  "), (5, "When?")]
  for content in ("Who?\nWhere?", "Who?\nWhere?\n", "Who?\r\nWhere?\r\n"):
    assert len(rows.read_rows(_write(tmp_path / "two.txt", content))) == 2
  table = _write(tmp_path / "in.csv", 'text,id\nWho?,1\n\n"",3\n')
  assert rows.read_rows(table) == [(2, {"text": "Who?", "id": "1"}),
                                   (3, {"text": "", "id": ""}),
                                   (4, {"text": "", "id": "3"})]
  assert rows.pick(rows.read_rows(table), ["text"], "in.csv") == [["Who?"], [""], [""]]
  jsonl = _write(tmp_path / "in.jsonl", '{"text": "Who?"}\n\n{"text": "x"}\n')
  with pytest.raises(ValueError, match=r"in\.jsonl:2: blank line, not a JSON object"):
    rows.read_rows(jsonl)
  # Training data passes blank lines over, as before.
  train = _write(tmp_path / "train.csv", "text,label\na,x\n\nb,y\n")
  assert file_task.read_split(TEXT, train).texts == ["a", "b"]


def test_an_output_stopped_halfway_leaves_the_file_that_was_there(tmp_path):
  """predict writes beside --output and renames at the end: an error or
  Ctrl-C mid-run keeps the old file, or the input a run writes over."""
  out = _write(tmp_path / "in.csv", "text\na\nb\n")
  with pytest.raises(KeyboardInterrupt):
    with rows.Writer(str(out)) as writer:
      writer.write({"text": "a", "label": "x"})
      raise KeyboardInterrupt
  assert (tmp_path / "in.csv").read_text() == "text\na\nb\n" and os.listdir(tmp_path) == ["in.csv"]
  with rows.Writer(str(out)) as writer:
    writer.write({"text": "a", "label": "x"})
  assert (tmp_path / "in.csv").read_text().splitlines() == ["text,label", "a,x"]
  assert os.listdir(tmp_path) == ["in.csv"]


def test_a_table_output_has_every_rows_fields_and_the_prediction_its_own(tmp_path):
  path = _write(tmp_path / "in.jsonl", '{"text": "a"}\n'
                '{"text": "b", "id": 7, "label": "gold"}\n')
  read = rows.read_rows(path)
  fields = rows.fields_of(read)
  assert fields == ["text", "id", "label"]
  writer = rows.Writer(str(tmp_path / "preds" / "out.csv"), columns=fields)  # makes preds/
  for (_, row), label in zip(read, ["p0", "p1"]):
    pred = {"label": label, "probabilities": {"p0": 0.25, "p1": 0.75}, "tags": ["A"]}
    writer.write(predict.with_prediction(row, pred, fields))
  writer.close()
  with open(tmp_path / "preds" / "out.csv", newline="", encoding="utf-8") as f:
    out = list(csv.DictReader(f))
  # A column per class, for a spreadsheet to sort by; a list stays JSON.
  assert list(out[0]) == ["text", "id", "label", "predicted_label",
                          "predicted_probabilities.p0", "predicted_probabilities.p1",
                          "predicted_tags"]
  assert [(r["id"], r["label"], r["predicted_label"], r["predicted_probabilities.p1"],
           r["predicted_tags"]) for r in out] == [("", "", "p0", "0.75", '["A"]'),
                                                  ("7", "gold", "p1", "0.75", '["A"]')]
  # That output predicted again keeps its probabilities.p0 columns too.
  again = predict.with_prediction({"text": "a", "probabilities.p0": "0.25"},
                                  {"probabilities": {"p0": 0.5}},
                                  ["text", "probabilities.p0"])
  assert again["predicted_probabilities"] == {"p0": 0.5}
  # A prediction field taken as well (an earlier output read back) is not
  # overwritten either.
  row = {"text": "a", "label": "gold", "predicted_label": "old"}
  assert predict.with_prediction(row, {"label": "new"}, list(row)) == {
      **row, "predicted_predicted_label": "new"}
  assert predict.with_prediction({"text": "a"}, {"label": "new"}, ["text"]) == {
      "text": "a", "label": "new"}


@pytest.mark.parametrize("name, content, line", [
    ("bad.txt", b"Who?\ncaf\xe9 when?\n", 2),
    ("bad.csv", b"text,id\nWho?,1\ncaf\xe9 when?,2\n", 3),
    ("bad.jsonl", b'{"text": "Who?"}\n{"text": "caf\xe9"}\n', 2),
])
def test_a_byte_that_is_not_utf8_names_its_line_and_the_byte(tmp_path, name, content,
                                                             line):
  path = _write(tmp_path / name, content)
  with pytest.raises(ValueError,
                     match=rf"{name}:{line}: not valid utf-8 \(byte 0xe9: "):
    rows.read_rows(path)
