"""Pre-tokenized ArrayRecord shards: the tool's round trip, a run reading
them with their tokenizer, and a clear refusal of another tokenizer."""

import json

import numpy as np
import pytest

from jaxtl.configs import pretrain_clm
from jaxtl.pretraining import pipeline
from jaxtl.pretraining import config as pretrain_config
from jaxtl.data import pretokenized, sources
from jaxtl.pretraining import pretokenize

pytest.importorskip("array_record")


def _config(tmp_path):
  lines = [f"line {i} of the {'odd' if i % 2 else 'even'} kind" for i in range(300)]
  (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
  (tmp_path / "valid.txt").write_text("\n".join(lines[:40]) + "\n")
  config = pretrain_clm.get_config()
  with config.unlocked():
    config.data.source = dict(kind="text", files=dict(
        train=[str(tmp_path / "train.txt")], validation=[str(tmp_path / "valid.txt")]))
  config.data.tokenizer.update(vocab_size=200, model_type="bpe")
  config.data.update(seq_len=8, batch_size=8)
  return config


def _read_back(config, folder, workdir):
  config.data.source = dict(kind="pretokenized", data_dir=str(folder))
  return pipeline.DataSetup(pretrain_config.of(config), str(workdir))


def test_shards_round_trip_into_the_same_rows(tmp_path):
  config = _config(tmp_path)
  meta = pretokenize.pretokenize(pretrain_config.of(config), str(tmp_path / "shards"), num_shards=3)
  assert meta["splits"]["train"]["documents"] == 300
  assert len(meta["splits"]["train"]["shards"]) == 3
  tok = pretokenized.recorded_tokenizer(str(tmp_path / "shards"))
  texts = sources.load_texts(sources.source_config(config.data.source), "train")
  docs = pretokenized.read(str(tmp_path / "shards"), "train", tok)
  assert [d.tolist() for d in docs] == tok.encode_batch(texts)
  # A run on the text and a run on the shards cut the same rows, with the
  # recorded tokenizer (none trained).
  text_run = pipeline.DataSetup(pretrain_config.of(config), str(tmp_path / "text_run"))
  shard_run = _read_back(config, tmp_path / "shards", tmp_path / "shard_run")
  assert shard_run.tokenizer.fingerprint() == meta["tokenizer"]["fingerprint"]
  for split in ("train", "validation"):
    np.testing.assert_array_equal(shard_run.rows_tokens(split),
                                  text_run.rows_tokens(split))
  with pytest.raises(ValueError, match="no split 'test' pretokenized; it has"):
    pretokenized.read(str(tmp_path / "shards"), "test", tok)
  with pytest.raises(ValueError, match="holds token ids, not texts"):
    sources.load_texts(sources.PretokenizedSource(kind="pretokenized", data_dir="x"),
                       "train")


def test_another_tokenizer_is_refused_naming_both(tmp_path):
  config = _config(tmp_path)
  pretokenize.pretokenize(pretrain_config.of(config), str(tmp_path / "shards"))
  config.data.tokenizer.update(vocab_size=180)
  other = pipeline.DataSetup(pretrain_config.of(config), str(tmp_path / "other")).tokenizer
  with pytest.raises(ValueError, match=r"tokenized with tokenizer \w+ .*"
                                       r"spm_bpe_200.model.*the run's is \w+"):
    pretokenized.read(str(tmp_path / "shards"), "train", other)
  config.data.tokenizer.path = other.model_path
  with pytest.raises(ValueError, match="config.data.tokenizer.path"):
    _read_back(config, tmp_path / "shards", tmp_path / "run")


def test_a_folder_without_metadata_says_how_to_make_one(tmp_path):
  (tmp_path / "train-00000-of-00001.array_record").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match="jaxtl pretokenize"):
    pretokenized.metadata(str(tmp_path))
  (tmp_path / "pretokenized.json").write_text(json.dumps({"format": 99}))
  with pytest.raises(ValueError, match="format 99"):
    pretokenized.metadata(str(tmp_path))
