"""A model fine-tuned before the package's layers moved (jaxtl at commit
955050c, 2026-11-25) still loads and predicts what it predicted then: the
workdir format is the user's, not the code's.

tests/fixtures/workdir_2026_11_25 is that run's workdir, trimmed to what
``jaxtl.load`` reads (best/, task.json, model_config.json, tokenizer/): a
1-layer, 16-wide BERT fine-tuned on 18 made-up rows (``good film,pos``),
and expected.json the predictions the old code made for four texts.
"""

import json
import pathlib
import shutil

import numpy as np

import jaxtl
from jaxtl.tasks import file_predictions

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "workdir_2026_11_25"


def _workdir(tmp_path):
  return str(shutil.copytree(FIXTURE, tmp_path / "wd"))


def _probabilities(preds):
  return np.array([[p["probabilities"][k] for k in sorted(p["probabilities"])]
                   for p in preds])


def test_an_old_workdir_loads_and_predicts_as_it_did(tmp_path):
  expected = json.loads((FIXTURE / "expected.json").read_text())
  preds = jaxtl.load(_workdir(tmp_path)).predict(expected["texts"])
  assert [p["label"] for p in preds] == [p["label"] for p in expected["predictions"]]
  np.testing.assert_allclose(_probabilities(preds),
                             _probabilities(expected["predictions"]), atol=1e-5)


def test_jaxtl_predict_reads_an_old_workdir(tmp_path):
  expected = json.loads((FIXTURE / "expected.json").read_text())
  rows = tmp_path / "in.txt"
  rows.write_text("\n".join(expected["texts"]) + "\n")
  out = tmp_path / "out.jsonl"
  assert file_predictions.predict_file(_workdir(tmp_path), str(rows), str(out)) == 4
  labels = [json.loads(line)["label"] for line in out.read_text().splitlines()]
  assert labels == [p["label"] for p in expected["predictions"]]
