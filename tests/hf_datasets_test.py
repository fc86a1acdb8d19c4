"""Tests for jaxtl.data.hf_datasets: tiny datasets made here, no network."""

from __future__ import annotations

import dataclasses
import time

import pytest

from jaxtl.data import hf_datasets, network, sources

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def _quiet():
  datasets.disable_progress_bars()


def _pairs_dict(tmp_path):
  """A saved DatasetDict like GLUE's QNLI: two text columns, a ClassLabel,
  and a test split whose labels are -1 (unlabeled)."""
  features = datasets.Features({
      "question": datasets.Value("string"), "sentence": datasets.Value("string"),
      "label": datasets.ClassLabel(names=["entailment", "not_entailment"])})
  rows = lambda n, labels: {"question": [f"q{i}" for i in range(n)],
                            "sentence": [f"s{i}" for i in range(n)], "label": labels}
  folder = tmp_path / "qnli"
  datasets.DatasetDict(
      train=datasets.Dataset.from_dict(rows(3, [1, 0, 1]), features=features),
      test=datasets.Dataset.from_dict(rows(1, [-1]), features=features),
  ).save_to_disk(str(folder))
  return str(folder)


def test_save_to_disk_folder_with_column_mapping_and_label_names(tmp_path):
  folder = _pairs_dict(tmp_path)
  spec = {"name": folder, "columns": {"text": "question", "text_pair": "sentence"}}
  got = list(hf_datasets.records(spec, "train"))
  assert got[2] == (f"{folder} train row 2",
                    {"text": "q2", "text_pair": "s2", "label": "not_entailment"})
  assert [row["label"] for _, row in got] == ["not_entailment", "entailment",
                                              "not_entailment"]
  assert hf_datasets.label_names(spec) == ("entailment", "not_entailment")
  # Unlabeled rows (GLUE test: -1) read as None, not as a wrapped-around name.
  assert list(hf_datasets.records(spec, "test"))[0][1]["label"] is None
  with pytest.raises(ValueError, match=r"has splits \['test', 'train'\]"):
    list(hf_datasets.records(spec, "validation"))
  with pytest.raises(ValueError, match="no column 'premise'.*'question'"):
    list(hf_datasets.records({"name": folder, "columns": {"text": "premise"}}, "train"))


def test_token_tags_and_plain_labels(tmp_path):
  features = datasets.Features({
      "tokens": datasets.List(datasets.Value("string")),
      "tags": datasets.List(datasets.ClassLabel(names=["O", "B-PER"])),
      "topic": datasets.Value("string")})
  ds = datasets.Dataset.from_dict(
      {"tokens": [["Ada", "wrote"]], "tags": [[1, 0]], "topic": ["x"]},
      features=features)
  ds.save_to_disk(str(tmp_path / "one"))  # A lone Dataset: read as train.
  spec = hf_datasets.HFSpec(name=str(tmp_path / "one"))
  (where, row), = hf_datasets.records(spec, "train")
  assert where.endswith("one train row 0") and row["tags"] == ["B-PER", "O"]
  assert hf_datasets.label_names(spec, field="tags") == ("O", "B-PER")
  assert hf_datasets.label_names(spec, field="topic") is None
  with pytest.raises(ValueError, match="holds one Dataset"):
    list(hf_datasets.records(spec, "test"))


def test_local_files_through_the_builders(tmp_path):
  (tmp_path / "a.csv").write_text('text,label\n"hi, there",pos\nbye,neg\n')
  (tmp_path / "b.tsv").write_text('sentence\tlabel\nsaid "so\t1\n')
  (tmp_path / "c.jsonl").write_text('{"text": "x", "label": 1}\n')
  cache = str(tmp_path / "cache")
  read = lambda name, *paths: list(hf_datasets.records(
      {"name": name, "files": {"train": [str(tmp_path / p) for p in paths]},
       "cache_dir": cache}, "train"))
  got = read("csv", "a.csv")
  assert got[0] == (f"{tmp_path / 'a.csv'} row 0", {"text": "hi, there", "label": "pos"})
  assert read("tsv", "b.tsv")[0][1] == {"sentence": 'said "so', "label": 1}
  # Each file is its own part, so a location names the file it came from.
  assert [w for w, _ in read("json", "c.jsonl", "c.jsonl")] == [
      f"{tmp_path / 'c.jsonl'} row 0"] * 2
  with pytest.raises(FileNotFoundError, match="missing.csv"):
    read("csv", "missing.csv")
  with pytest.raises(ValueError, match=r"unknown split 'test'.*\['train'\]"):
    list(hf_datasets.records({"name": "csv", "files": {"train": "a.csv"}}, "test"))


def test_hub_name_offline_fails_in_seconds_and_says_what_to_do(tmp_path, monkeypatch):
  cache = tmp_path / "cache"
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # HF_DATASETS_OFFLINE=1
  start = time.perf_counter()
  with pytest.raises(network.DataUnavailable) as e:
    list(hf_datasets.records({"name": "glue", "subset": "qnli",
                              "cache_dir": str(cache)}, "train"))
  assert time.perf_counter() - start < 5
  message = str(e.value)
  for part in ("'glue/qnli'", str(cache), "offline mode", "save_to_disk",
               "load_dataset('glue', 'qnli')", "files="):
    assert part in message, part
  # No network and no offline flag: the probe says so before any retry.
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(network, "unreachable", lambda url: "no network: test")
  with pytest.raises(network.DataUnavailable, match="'ag_news'.*no network: test"):
    list(hf_datasets.records({"name": "ag_news", "cache_dir": str(cache)}, "train"))
  assert datasets.config.HF_HUB_OFFLINE is False  # Restored after the call.
  assert not any(cache.rglob("*.arrow"))


@pytest.mark.parametrize("read,flags", [
    (lambda cache: list(hf_datasets.records(
        {"name": "glue", "subset": "sst2", "cache_dir": cache,
         "flags": "--config.task.hf"}, "train")), "--config.task.hf"),
    (lambda cache: sources.load_texts(sources.source_config(
        {"kind": "hf", "name": "glue", "cache_dir": cache}), "train"),
     "--config.data.source"),
    (lambda cache: sources.load_texts(sources.source_config(
        {"kind": "mixture", "parts": {"wiki": {"kind": "hf", "name": "glue",
                                               "cache_dir": cache}}}), "train"),
     "--config.data.source.parts.wiki"),
])
def test_offline_hub_dataset_names_the_flags_that_point_elsewhere(tmp_path, monkeypatch,
                                                                  read, flags):
  """From the command line the fix is a flag, not a spec's Python syntax."""
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  with pytest.raises(network.DataUnavailable) as e:
    read(str(tmp_path))
  message = str(e.value)
  assert f"{flags}.name=FOLDER" in message and f"{flags}.cache_dir=CACHE" in message
  assert "files={" not in message and "save_to_disk('FOLDER')" in message


def test_pretraining_source_kind_hf(tmp_path):
  folder = tmp_path / "wiki"
  datasets.DatasetDict(
      train=datasets.Dataset.from_dict({"text": ["one", "", "two"]}),
      validation=datasets.Dataset.from_dict({"text": ["three"]}),
  ).save_to_disk(str(folder))
  source = sources.source_config({"kind": "hf", "name": str(folder), "field": "text"})
  assert isinstance(source, sources.HFSource)
  assert sources.load_texts(source, "train") == ["one", "two"]  # blanks dropped
  assert sources.load_texts(source, "validation") == ["three"]  # split by its name
  # A recipe's files, left from its own kind (jsonl under {data_dir}), are
  # not a folder's: they are neither read nor checked.
  leftover = dataclasses.replace(source, files={"train": ("{data_dir}/imdb/x.jsonl.gz",)})
  sources.check_files(leftover, ("train",))
  assert sources.load_texts(leftover, "train") == ["one", "two"]
  (tmp_path / "t.jsonl").write_text('{"body": "four"}\n{"body": 5}\n')
  files = sources.HFSource(kind="hf", name="json", field="body",
                           files={"train": [str(tmp_path / "t.jsonl")]},
                           cache_dir=str(tmp_path / "cache"))
  with pytest.raises(ValueError, match=r"t\.jsonl row 1: field 'body' is int"):
    sources.load_texts(files, "train")
  (tmp_path / "u.jsonl").write_text('{"body": "five"}\n')
  mixture = sources.source_config({"kind": "mixture", "parts": {
      "a": {"kind": "hf", "name": str(folder)},
      "b": {"kind": "hf", "name": "json", "field": "body", "cache_dir": str(tmp_path / "cache"),
            "files": {"train": [str(tmp_path / "u.jsonl")]}}}})
  assert sources.load_texts(mixture, "train") == ["one", "two", "five"]
  # A builder part on files has only the splits it lists; a folder has its own.
  assert sources.load_texts(mixture, "validation") == ["three"]
