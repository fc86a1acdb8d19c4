"""The measuring scripts under launch/ still run: they are how issue-sized
speed claims are checked, and nothing else calls them between sessions."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.subprocess
def test_minilm_trec_runs_both_sides_on_a_few_questions(tmp_path, small_bert):
  """The recipe on a small BERT with MiniLM's vocabulary: both sides, a few
  steps each (MiniLM itself: finetune_test)."""
  data = os.environ.get("JAXTL_DATA_DIR", "")
  if not os.path.isdir(os.path.join(data, "trec")):
    pytest.skip("TREC-6 is not in $JAXTL_DATA_DIR")
  env = {**os.environ, "JAXTL_KEEP_MEMORY": "0"}
  out = subprocess.run(
      [sys.executable, "launch/minilm_trec.py", "--seeds=0", "--epochs=1",
       "--train_examples=64", "--eval_examples=32", f"--init_from={small_bert}",
       f"--workdir={tmp_path / 'run'}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  for side in ("jaxtl", "torch"):
    (run,) = summary[side]
    assert 0 <= run["test"] <= 1 and len(run["seconds"]) == 1 and run["wall"] > 0
  assert summary["speed_ratio"] > 0
  assert "jaxtl epochs are" in out.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_step_floor_prints_the_floor_and_the_step():
  """launch/step_floor.py on a tiny classifier: every part timed, the floor
  their sum."""
  out = subprocess.run(
      [sys.executable, "launch/step_floor.py", "--preset=tiny_cls", "--batch_size=2",
       "--length=16", "--repeats=1"],
      cwd=REPO, env={**os.environ, "JAXTL_KEEP_MEMORY": "0"}, capture_output=True,
      text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = dict(line.strip("| ").rsplit(" | ", 1) for line in out.stdout.splitlines()
              if line.startswith("| ") and not line.startswith("| part"))
  parts = [float(ms.replace(",", "")) for name, ms in rows.items()
           if not name.startswith(("**", "the rest"))]
  assert len(parts) == 3 and all(ms > 0 for ms in parts)
  assert float(rows["**floor** (their sum)"].replace(",", "")) == pytest.approx(sum(parts), abs=0.2)
