r"""Few-shot accuracy against the number of shots: the GPT-3 table, for a
jaxtl causal model (``jaxtl prompt``).

  jaxtl prompt --checkpoint=workdirs/study/pretrain_clm --task=trec,sst2 \
    --shots=0,1,4,8 --seeds=0,1,2 --max_len=64 --out=workdirs/prompting

``--checkpoint`` is a jaxtl workdir or a Hugging Face GPT-2 folder. For each
task, number of shots k and seed (k = 0 needs one), prompts the task's test
inputs (TREC test, SST-2 dev: :data:`jaxtl.tasks.readers.EVAL_SPLITS`) after
k demonstrations from its training split and scores them by rank
classification, with and without calibration (:mod:`jaxtl.eval.prompting`).
Writes ``prompting.md`` (accuracy, mean ± std over seeds, beside the
majority-class and chance rates), ``prompting.png`` (accuracy vs k) and
``prompting.json`` (every run) into ``--out``.

``--max_len``: the context the model reads; give the length it was
pretrained on when shorter than its positions table (a prompt is then cut
on the left, dropping the oldest demonstrations first).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxtl.eval import prompting
from jaxtl.tasks import readers

MARKDOWN, FIGURE, RESULTS = "prompting.md", "prompting.png", "prompting.json"


def task_splits(task: str, max_eval_examples: int = 0
                ) -> tuple[Any, Any, str]:
  """(train, evaluation split, its name) of a built-in task."""
  if task not in readers.EVAL_SPLITS:
    raise ValueError(f"--task={task}: unknown; known: {', '.join(readers.EVAL_SPLITS)}")
  split = readers.EVAL_SPLITS[task]
  train, test = readers.load_task(task, "train"), readers.load_task(task, split)
  if test.label_names is None or test.words is not None:
    raise ValueError(f"--task={task}: prompting classifies sentences (or pairs); "
                     f"{task} is not such a task")
  if max_eval_examples and max_eval_examples < len(test):
    test = test.sample(max_eval_examples, 0)  # one fixed sample for every run
  return train, test, split


def run(loaded: Any, tasks: Sequence[str], shots: Sequence[int], seeds: Sequence[int],
        *, calibrated: bool = True, batch_size: int = 32, max_len: int | None = None,
        max_eval_examples: int = 0, prompts: dict[str, prompting.Prompt] | None = None
        ) -> list[dict[str, Any]]:
  """One row per (task, shots, seed): accuracies and what was shown.

  ``loaded``: a :class:`jaxtl.pretraining.pretrained.Pretrained` causal model.
  """
  rows = []
  for task in tasks:
    train, test, split = task_splits(task, max_eval_examples)
    prompt = (prompts or {}).get(task) or prompting.default_prompt(task, test.label_names)
    counts = np.bincount(np.asarray(test.labels), minlength=len(test.label_names))
    for k in shots:
      for seed in (seeds if k else seeds[:1]):  # zero-shot draws nothing
        start = time.time()
        r = prompting.evaluate(loaded.config, loaded.params, loaded.tokenizer, prompt,
                               train, test, shots=k, seed=seed, calibrated=calibrated,
                               batch_size=batch_size, max_len=max_len)
        cal = "" if r.calibrated_accuracy is None else f", calibrated {r.calibrated_accuracy:.3f}"
        logging.info("%s k=%d seed=%d: accuracy %.3f%s (%.0f s)", task, k, seed,
                     r.accuracy, cal, time.time() - start)
        rows.append({"task": task, "split": split, "shots": k, "seed": seed,
                     "examples": len(test), "majority": float(counts.max() / len(test)),
                     "chance": 1 / len(test.label_names), "template": prompt.template,
                     "label_words": list(prompt.label_words),
                     **dataclasses.asdict(r)})
  return rows


def _by_cell(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, int], np.ndarray]:
  cells: dict[tuple[str, int], list[float]] = {}
  for r in rows:
    if r[key] is not None:
      cells.setdefault((r["task"], r["shots"]), []).append(100 * r[key])
  return {k: np.asarray(v) for k, v in cells.items()}


def _mean_std(values: np.ndarray | None) -> str:
  if values is None or not len(values):
    return ""
  if len(values) == 1:
    return f"{values[0]:.1f}"
  return f"{values.mean():.1f} ± {values.std(ddof=1):.1f}"


def _top_share(rows: list[dict[str, Any]]) -> str:
  """Mean share (%) of the most predicted class, raw / calibrated."""
  def share(preds: list[int] | None) -> float:
    return 100 * np.bincount(preds).max() / len(preds) if preds else float("nan")
  raw = np.mean([share(r["predictions"]) for r in rows])
  if rows[0]["calibrated_predictions"] is None:
    return f"{raw:.0f}%"
  return f"{raw:.0f}% / {np.mean([share(r['calibrated_predictions']) for r in rows]):.0f}%"


def markdown_table(rows: list[dict[str, Any]]) -> str:
  """Accuracy (%) per task and k, raw and calibrated, mean ± std over seeds."""
  raw, cal = _by_cell(rows, "accuracy"), _by_cell(rows, "calibrated_accuracy")
  seeds = len({r["seed"] for r in rows if r["shots"]})
  lines = [f"Accuracy (%); k > 0: mean ± std over {seeds} seed(s) of demonstrations. "
           "Top class: the share of inputs given the most often predicted class "
           "(raw / calibrated), 100% for a model that always says the same.",
           "", "| task (split, n) | k | accuracy | calibrated | top class | prompt tokens |"
           " cut to fit | majority class | chance |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for (task, k), values in raw.items():
    first = next(r for r in rows if r["task"] == task and r["shots"] == k)
    same = [r for r in rows if r["task"] == task and r["shots"] == k]
    lines.append(
        f"| {task} ({first['split']}, {first['examples']}) | {k} | {_mean_std(values)} | "
        f"{_mean_std(cal.get((task, k)))} | {_top_share(same)} | "
        f"{np.mean([r['prompt_tokens'] for r in same]):.0f} | "
        f"{100 * np.mean([r['truncated'] for r in same]):.0f}% | "
        f"{100 * first['majority']:.1f} | {100 * first['chance']:.1f} |")
  return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: str) -> None:
  """Accuracy vs shots, one panel per task: raw and calibrated (bars: one
  std over seeds), the majority class and chance as horizontal lines."""
  # optional (jaxtl[analysis]) and slow to import: only the figure needs it
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  tasks = list(dict.fromkeys(r["task"] for r in rows))
  fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
  for ax, task in zip(axes[0], tasks):
    for key, label, marker in (("accuracy", "rank classification", "o"),
                               ("calibrated_accuracy", "calibrated", "s")):
      cells = {k: v for (t, k), v in _by_cell(rows, key).items() if t == task}
      if cells:
        ks = sorted(cells)
        ax.errorbar([str(k) for k in ks], [cells[k].mean() for k in ks],
                    yerr=[cells[k].std(ddof=1) if len(cells[k]) > 1 else 0 for k in ks],
                    marker=marker, capsize=3, label=label)
    first = next(r for r in rows if r["task"] == task)
    ax.axhline(100 * first["majority"], color="grey", ls="--", label="majority class")
    ax.axhline(100 * first["chance"], color="grey", ls=":", label="chance")
    # The whole scale: a zoomed axis would make noise of a point look like a trend.
    ax.set(title=f"{task} ({first['split']}, {first['examples']})", ylim=(0, 100),
           xlabel="demonstrations k", ylabel="accuracy (%)")
    ax.grid(alpha=0.3)
  axes[0][-1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write(rows: list[dict[str, Any]], out: str) -> None:
  """prompting.json, prompting.md and prompting.png into ``out``."""
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, RESULTS), "w") as f:
    json.dump(rows, f, indent=1)
  with open(os.path.join(out, MARKDOWN), "w") as f:
    f.write(markdown_table(rows))
  plot(rows, os.path.join(out, FIGURE))
