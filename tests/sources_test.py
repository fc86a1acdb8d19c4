"""Tests for jaxtl.data.sources: synthetic error cases and the real files."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import sys
import time

import pytest

import datadir
from jaxtl.data import sources, text_files, tfds_reader


def _write_jsonl(path, rows, gz=False):
  text = "".join(json.dumps(r) + "\n" for r in rows)
  if gz:
    with gzip.open(path, "wt", encoding="utf-8") as f:
      f.write(text)
  else:
    path.write_text(text, encoding="utf-8")
  return path


# --- read_text ---------------------------------------------------------------


def test_read_text_lines_and_paragraphs(tmp_path):
  path = tmp_path / "wiki.txt"
  path.write_text(" \n = Title = \n\n Body line one . \r\n \n Two\n",
                  encoding="utf-8")
  assert text_files.read_text(path) == [" = Title = ", " Body line one . ",
                                     " Two"]
  whole = text_files.read_text(path, paragraphs=True)
  assert whole == [path.read_text(encoding="utf-8")]
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n", encoding="utf-8")
  assert text_files.read_text(empty) == []
  assert text_files.read_text(empty, paragraphs=True) == []


def test_read_text_wrong_encoding_names_line(tmp_path):
  path = tmp_path / "latin.txt"
  path.write_bytes("ok\nsister\xf0city\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"latin\.txt:2.*latin-1"):
    text_files.read_text(path)
  assert text_files.read_text(path, encoding="latin-1")[1] == "sister\xf0city"


# --- read_jsonl --------------------------------------------------------------


def test_read_jsonl_gz_round_trip(tmp_path):
  rows = [{"text": "good film", "label": 1}, {"text": "bad", "label": 0},
          {"text": "caf\u00e9 <br />", "label": 1}]
  for gz in (False, True):
    path = _write_jsonl(tmp_path / ("r.jsonl.gz" if gz else "r.jsonl"), rows,
                        gz=gz)
    assert text_files.read_jsonl(path) == [r["text"] for r in rows]


def test_read_jsonl_malformed_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"text": "a"}\n\n{"text": "b"\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"bad\.jsonl:3.*malformed"):
    text_files.read_jsonl(path)
  path.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid utf-8"):
    text_files.read_jsonl(path)
  path.write_text('{"text": "a"}\n["b"]\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"bad\.jsonl:2: expected a JSON object"):
    text_files.read_jsonl(path)


def test_read_jsonl_missing_field(tmp_path):
  path = _write_jsonl(tmp_path / "f.jsonl", [{"text": "a"}, {"body": "b"}])
  with pytest.raises(ValueError, match=r"f\.jsonl:2.*'text'"):
    text_files.read_jsonl(path)
  with pytest.raises(ValueError, match=r"f\.jsonl:1.*'label'"):
    text_files.read_jsonl(path, field="label")


def test_read_jsonl_empty_text(tmp_path):
  path = _write_jsonl(tmp_path / "e.jsonl.gz", [{"text": "a"}, {"text": " "}],
                      gz=True)
  with pytest.raises(ValueError, match=r"e\.jsonl\.gz:2.*empty"):
    text_files.read_jsonl(path)


# --- read_tsv_column ---------------------------------------------------------


def test_read_tsv_bom_header_and_quotes(tmp_path):
  path = tmp_path / "mrpc.tsv"
  path.write_bytes(
      "\ufeffQuality\t#1 String\t#2 String\n"
      '1\tHe said " hi\t" Odd quote\n\n0\tx\ty\n'.encode("utf-8"))
  assert text_files.read_tsv_column(path, "#1 String") == ['He said " hi', "x"]
  assert text_files.read_tsv_column(path, "Quality") == ["1", "0"]  # BOM dropped
  with pytest.raises(ValueError, match=r"no column '#3 String'.*Quality"):
    text_files.read_tsv_column(path, "#3 String")
  empty = tmp_path / "empty.tsv"
  empty.write_text("", encoding="utf-8")
  assert text_files.read_tsv_column(empty, "Quality") == []


def test_read_tsv_too_few_columns(tmp_path):
  path = tmp_path / "short.tsv"
  path.write_text("a\tb\tc\n1\t2\t3\n4\t5\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"short\.tsv:3.*2 columns"):
    text_files.read_tsv_column(path, "c")


# --- missing files and load_texts --------------------------------------------


def test_missing_files(tmp_path):
  for reader in (text_files.read_text, text_files.read_jsonl,
                 lambda p: text_files.read_tsv_column(p, "text")):
    with pytest.raises(FileNotFoundError, match="absent.txt"):
      reader(tmp_path / "absent.txt")


def test_load_texts_dispatch(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXTL_DATA_DIR", str(tmp_path))
  _write_jsonl(tmp_path / "a.jsonl", [{"body": "one"}, {"body": "two"}])
  _write_jsonl(tmp_path / "b.jsonl.gz", [{"body": "three"}], gz=True)
  (tmp_path / "v.txt").write_text("x\n\ny\n", encoding="utf-8")
  (tmp_path / "t.tsv").write_text("s\tl\nhi\t1\n", encoding="utf-8")
  jsonl = sources.source_config({
      "kind": "jsonl", "field": "body",
      "files": {"train": ["{data_dir}/a.jsonl", "{data_dir}/b.jsonl.gz"],
                "validation": "{data_dir}/a.jsonl"}})
  assert isinstance(jsonl, sources.FileSource)
  assert sources.load_texts(jsonl, "train") == ["one", "two", "three"]
  assert sources.load_texts(jsonl, "validation") == ["one", "two"]
  text = sources.FileSource(kind="text",
                            files={"validation": [str(tmp_path / "v.txt")]})
  assert sources.load_texts(text, "validation") == ["x", "y"]
  tsv = sources.source_config({"kind": "tsv", "field": "s",
                               "files": {"train": "{data_dir}/t.tsv"}})
  assert sources.load_texts(tsv, "train") == ["hi"]
  with pytest.raises(ValueError, match=r"files for train, validation only, none for split "
                                       r"'test': name them with --config.data.source.files.test"):
    sources.load_texts(jsonl, "test")
  with pytest.raises(ValueError, match=r"source.kind='csv'.*jsonl, tsv, parquet"):
    sources.source_config({"kind": "csv"})
  with pytest.raises(ValueError, match=r"source.kind='csv'.*jsonl, tsv, parquet"):
    sources.load_texts(sources.FileSource(kind="csv"), "train")
  with pytest.raises(ValueError, match="source.kind='tfds' is read by TfdsSource"):
    sources.load_texts(sources.FileSource(kind="tfds"), "train")
  # No mappings: a caller builds the typed section once, with source_config.
  with pytest.raises(TypeError, match="source_config"):
    sources.load_texts({"kind": "text", "files": {"train": "x"}}, "train")


def test_tsv_source_reads_the_field_column(tmp_path):
  """kind=tsv reads the column named by ``field`` from the header line, the
  recipe's key: settable from the command line like any other kind's."""
  (tmp_path / "a.tsv").write_bytes("\ufeffid\tsentence\tlabel\n"
                                   '1\tHe said " hi\t0\n\n2\tsecond\t1\n'
                                   .encode("utf-8"))
  (tmp_path / "b.tsv").write_text("sentence\nthird\n", encoding="utf-8")
  src = sources.source_config({
      "kind": "tsv", "field": "sentence",
      "files": {"train": [str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")]}})
  assert sources.load_texts(src, "train") == ['He said " hi', "second", "third"]
  label = sources.FileSource(kind="tsv", field="label",
                             files={"train": str(tmp_path / "a.tsv")})
  assert sources.load_texts(label, "train") == ["0", "1"]
  # The default field is "text": a file without that column says what it has.
  default = sources.source_config({"kind": "tsv",
                                   "files": {"train": str(tmp_path / "a.tsv")}})
  assert default.field == "text"
  with pytest.raises(ValueError, match=r"a.tsv: no column 'text'.*'sentence'"):
    sources.load_texts(default, "train")


def test_line_pattern_keeps_a_labeled_files_texts(tmp_path):
  (tmp_path / "t.label").write_bytes("DESC:def What is a caf\xe9 ?\nHUM:ind Who ?\n"
                                     .encode("latin-1"))
  src = sources.source_config({
      "kind": "text", "encoding": "latin-1", "line_pattern": r"^\S+ (.*)$",
      "files": {"train": [str(tmp_path / "t.label")]}})
  assert sources.load_texts(src, "train") == ["What is a caf\xe9 ?", "Who ?"]
  with pytest.raises(ValueError, match=r"document 1 .*line_pattern='\^x \(.\*\)'"):
    sources.load_texts(dataclasses.replace(src, line_pattern="^x (.*)"), "train")
  with pytest.raises(ValueError, match="needs a group"):
    sources.load_texts(dataclasses.replace(src, line_pattern="^x"), "train")


def test_mixture_concatenates_the_parts_that_have_the_split(tmp_path):
  (tmp_path / "a.txt").write_text("a1\na2\n", encoding="utf-8")
  (tmp_path / "b.txt").write_text("b1\n", encoding="utf-8")
  _write_jsonl(tmp_path / "c.jsonl", [{"text": "c1"}])
  mix = {"kind": "mixture", "parts": {
      "b": {"kind": "text", "files": {"train": [str(tmp_path / "b.txt")]}},
      "a": {"kind": "text", "files": {"train": [str(tmp_path / "a.txt")],
                                      "validation": [str(tmp_path / "a.txt")]}},
      "c": {"kind": "jsonl", "files": {"train": [str(tmp_path / "c.jsonl")]}}}}
  typed = sources.source_config(mix)
  assert sources.load_texts(typed, "train") == ["a1", "a2", "b1", "c1"]
  assert sources.load_texts(typed, "validation") == ["a1", "a2"]
  with pytest.raises(ValueError, match="no part of the mixture has split 'test'"):
    sources.load_texts(typed, "test")
  mix["parts"]["b"]["files"]["train"] = [str(tmp_path / "missing.txt")]
  with pytest.raises(FileNotFoundError, match="mixture part 'b'.*missing.txt"):
    sources.load_texts(sources.source_config(mix), "train")
  with pytest.raises(ValueError, match="needs 'parts'"):
    sources.load_texts(sources.source_config({"kind": "mixture"}), "train")
  for kind, refusal in (("mixture", "parts cannot be mixtures"),
                        ("pretokenized", "holds token ids, not texts")):
    nested = {"kind": "mixture", "parts": {"a": mix["parts"]["a"], "n": {"kind": kind}}}
    with pytest.raises(ValueError, match=f"mixture part 'n': .*{refusal}"):
      sources.load_texts(sources.source_config(nested), "train")


def test_source_config_of_a_mixture_builds_typed_parts():
  """A recipe's mixture (parts carrying their source's keys and a rate)
  becomes a MixtureSource of MixtureParts, each part's source the class of
  its kind and its rate the configured one (1.0 when left out)."""
  src = sources.source_config({
      "kind": "mixture", "mixing": "rates",
      "parts": {"web": {"kind": "jsonl", "rate": 2.0, "field": "body",
                        "files": {"train": ["{data_dir}/web.jsonl"]}},
                "books": {"kind": "text", "paragraphs": True, "rate": 0.5,
                          "files": {"train": "b.txt"}},
                "wiki": {"kind": "tfds", "name": "wiki40b"}}})
  assert isinstance(src, sources.MixtureSource)
  assert (src.mixing, src.cap, src.temperature) == ("rates", 0, 1.0)
  assert sorted(src.parts) == ["books", "web", "wiki"]
  assert all(isinstance(p, sources.MixturePart) for p in src.parts.values())
  web, books, wiki = src.parts["web"], src.parts["books"], src.parts["wiki"]
  assert web.rate == 2.0 and books.rate == 0.5 and wiki.rate == 1.0
  assert web.source == sources.FileSource(
      kind="jsonl", field="body", files={"train": ["{data_dir}/web.jsonl"]})
  assert isinstance(books.source, sources.FileSource) and books.source.paragraphs
  assert wiki.source == sources.TfdsSource(name="wiki40b")
  assert not hasattr(web.source, "rate")  # the rate is the part's, not the source's


def test_data_dir_resolution(monkeypatch):
  monkeypatch.delenv("JAXTL_DATA_DIR", raising=False)
  assert sources.resolve_data_dir() is None
  assert sources.resolve_data_dir("/flag") == "/flag"
  with pytest.raises(ValueError, match="JAXTL_DATA_DIR"):
    sources.require_data_dir()
  # A recipe's file under the data directory: the key and both ways out.
  with pytest.raises(ValueError, match=r"--config.data.source.files.train names "
                                       r"'{data_dir}/x', in the data directory, and none "
                                       r"is set: export JAXTL_DATA_DIR=FOLDER .* or name "
                                       r"your own files with --config.data.source.files."
                                       r"train=PATH"):
    sources.load_texts(sources.source_config(
        {"kind": "text", "files": {"train": ("/mine.txt", "{data_dir}/x")}}), "train")
  monkeypatch.setenv("JAXTL_DATA_DIR", "/env")
  assert sources.resolve_data_dir() == "/env"
  assert sources.resolve_data_dir("/flag") == "/flag"
  assert sources.require_data_dir() == "/env"


@pytest.mark.subprocess
def test_import_does_not_load_tensorflow():
  code = ("import sys, jaxtl.data.sources, jaxtl.data.tokenizers, jaxtl.data.hf_datasets; "
          "assert 'tensorflow' not in sys.modules and 'datasets' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True)


# --- real data ---------------------------------------------------------------


def test_imdb_unsup():
  path = datadir.require_data("imdb", "unsup.jsonl.gz")
  start = time.perf_counter()
  texts = text_files.read_jsonl(path)
  assert len(texts) == 50_000
  assert time.perf_counter() - start < 10
  assert sum("<br />" in t for t in texts) > 10_000


def test_imdb_test_as_a_jsonl_source():
  path = datadir.require_data("imdb", "test.jsonl.gz")
  src = sources.source_config({"kind": "jsonl", "files": {"test": str(path)}})
  assert sum(1 for _ in sources.iter_texts(src, "test")) == 25_000


def test_wikitext2_valid():
  path = datadir.require_data("wikitext2", "valid.txt")
  lines = text_files.read_text(path)
  assert len(lines) == 2461
  assert lines[0] == " = Homarus gammarus = "
  assert all(line.strip() for line in lines)


def test_glue_mrpc_bom_header():
  path = datadir.require_data("glue", "MRPC", "dev.tsv")
  first = text_files.read_tsv_column(path, "#1 String")
  second = text_files.read_tsv_column(path, "#2 String")
  labels = text_files.read_tsv_column(path, "Quality")
  assert len(first) == len(second) == len(labels) == 408
  assert set(labels) == {"0", "1"}


def test_glue_cola_without_a_header_is_refused_naming_its_first_line():
  """CoLA's TSVs have no header line: a tsv source cannot name its column,
  and says so with what it found (read CoLA as a task, jaxtl.tasks)."""
  path = datadir.require_data("glue", "CoLA", "dev.tsv")
  with pytest.raises(ValueError, match=r"dev.tsv: no column 'sentence'.*'gj04'"):
    text_files.read_tsv_column(path, "sentence")


def test_trec_is_latin1():
  path = datadir.require_data("trec", "train_5500.label")
  with pytest.raises(ValueError, match=r"train_5500\.label:66"):
    text_files.read_text(path)
  rows = text_files.read_text(path, encoding="latin-1")
  assert len(rows) == 5452
  assert "\xf0" in rows[65]


@pytest.mark.slow
def test_tfds_tiny_shakespeare(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  manual = datadir.require_data("tiny_shakespeare")
  source = sources.TfdsSource(kind="tfds", name="tiny_shakespeare",
                              data_dir=str(tmp_path), manual_dir=str(manual))
  texts = sources.load_texts(source, "validation")
  assert len(texts) == 1 and len(texts[0]) == 55_770
  assert isinstance(texts[0], str)


# --- offline: missing data fails at once, leaving nothing behind -------------


def test_tfds_unknown_name_is_one_line():
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(ValueError, match="TFDS has no dataset 'no_such_corpus'") as e:
    tfds_reader.read_tfds("no_such_corpus", "train")
  assert "\n" not in str(e.value)  # TFDS's own lists every dataset it has.


def test_tfds_offline_fails_in_seconds_and_leaves_nothing(tmp_path, monkeypatch):
  pytest.importorskip("tensorflow_datasets")
  monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)
  monkeypatch.setattr(sources.network, "unreachable", lambda url: "no network: test")
  data_dir = tmp_path / "tfds"
  start = time.perf_counter()
  with pytest.raises(sources.network.DataUnavailable) as e:
    sources.load_texts(sources.source_config(
        {"kind": "tfds", "name": "tiny_shakespeare", "data_dir": str(data_dir)}),
        "train")
  # Seconds, not the minutes of TFDS's download retries; the bound leaves
  # room for a cold TensorFlow import on a loaded 2-core machine (5.1 s once).
  assert time.perf_counter() - start < 30
  for part in ("'tiny_shakespeare'", str(data_dir), "no network: test",
               "--config.data.source.manual_dir=FOLDER", "--config.data.source.kind=text",
               "JAXTL_DATA_DIR", "~/tensorflow_datasets"):
    assert part in str(e.value), part
  assert not data_dir.exists()


def test_tfds_failed_preparation_removes_what_it_created(tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets")
  monkeypatch.setattr(sources.network, "unreachable", lambda url: None)
  data_dir = tmp_path / "tfds"

  class Builder:  # Fails as a download does, after writing partial folders.
    def download_and_prepare(self):
      (data_dir / "corpus" / "incomplete.x_1.0.0").mkdir(parents=True)
      (data_dir / "downloads" / "corpus").mkdir(parents=True)
      raise OSError("Max retries exceeded\nwith url")

  with pytest.raises(sources.network.DataUnavailable, match="Max retries exceeded"):
    tfds_reader._prepare_tfds(tfds, Builder(), "corpus", str(data_dir), None)
  assert not data_dir.exists()
  data_dir.mkdir()  # A data_dir that was there stays; only the new parts go.
  (data_dir / "other").mkdir()
  with pytest.raises(sources.network.DataUnavailable):
    tfds_reader._prepare_tfds(tfds, Builder(), "corpus", str(data_dir), None)
  assert sorted(p.name for p in data_dir.iterdir()) == ["other"]


def test_parquet_corpus_streams_its_column(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  pq.write_table(pa.table({"text": ["one", " ", "two"], "n": [1, 2, 3]}),
                 tmp_path / "c.parquet", row_group_size=1)
  src = sources.source_config({"kind": "parquet",
                               "files": {"train": str(tmp_path / "c.parquet")}})
  texts = sources.iter_texts(src, "train")
  assert next(texts) == "one"  # read a record batch at a time
  assert list(texts) == ["two"]
  with pytest.raises(ValueError, match=r"c.parquet: no column 'body'"):
    sources.load_texts(dataclasses.replace(src, field="body"), "train")
  pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "d.parquet")
  with pytest.raises(ValueError, match=r"d.parquet:row 1: column 'text' is NoneType"):
    sources.load_texts(sources.FileSource(
        kind="parquet", files={"train": str(tmp_path / "d.parquet")}), "train")


def test_texts_stream_as_they_are_consumed(tmp_path):
  """The first texts come before the reader reaches a bad line: nothing
  reads a whole file (or corpus) up front."""
  bad = tmp_path / "c.txt"
  bad.write_bytes(b"first\n" + b"x\n" * 100_000 + b"\xff\n")
  texts = sources.iter_texts(
      sources.source_config({"kind": "text", "files": {"train": str(bad)}}), "train")
  assert next(texts) == "first"
  with pytest.raises(ValueError, match=r"c.txt:100002: not valid utf-8"):
    list(texts)
  mix = {"kind": "mixture", "mixing": "rates",
         "parts": {"a": {"kind": "text", "rate": 1, "files": {"train": str(bad)}}}}
  with pytest.raises(ValueError, match="mixture part 'a'"):
    next(sources.iter_texts(sources.source_config(mix), "train"))  # counts first
