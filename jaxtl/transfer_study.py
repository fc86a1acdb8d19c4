"""The transfer study: does pretraining help a labeled task, and how much?

Pretrains each model of ``config.pretrain`` (sharing the first one's
tokenizer), then fine-tunes ``config.finetune``'s task from random and from
pretrained weights with every adaptation scheme of ``config.study`` at each
label budget, and writes ``transfer.md`` (test metric per init, scheme and
budget) and ``transfer.png`` (learning curves) into the workdir.

Every run keeps its own workdir: started again, the study resumes the
pretraining runs and skips fine-tuning runs that already wrote results.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from typing import Any

from jaxtl import finetune, train
from jaxtl.data import pipeline

# Named adaptation recipes: a fine-tuning scheme plus ``config.adapt``
# overrides. ULMFiT is full fine-tuning with discriminative learning rates
# and gradual unfreezing (all layers thawed by a third of training).
RECIPES: dict[str, dict[str, Any]] = {
    "full": {"scheme": "full"},
    "features": {"scheme": "features"},
    "scalar_mix": {"scheme": "scalar_mix"},
    "adapters": {"scheme": "adapters"},
    "lora": {"scheme": "lora"},
    "ulmfit": {"scheme": "full", "layer_decay": 0.8, "unfreeze": True},
}


def _pretrain(config: Any, workdir: str) -> dict[str, str]:
  """Runs (or resumes) every pretraining; returns name -> workdir."""
  dirs: dict[str, str] = {}
  tokenizer = ""
  for name in config.study.models:
    pre = copy.deepcopy(config.pretrain[name])
    if tokenizer:
      pre.data.tokenizer.path = tokenizer
    dirs[name] = os.path.join(workdir, f"pretrain_{name}")
    if not _finished(dirs[name], pre.train.steps):
      start = time.time()
      metrics = train.train_and_evaluate(pre, dirs[name])
      logging.info("pretraining %s: %s (%.0f s)", name, metrics, time.time() - start)
    if not tokenizer:
      tokenizer = pipeline.workdir_tokenizer(dirs[name]).model_path
  return dirs


def _finished(workdir: str, steps: int) -> bool:
  """Whether a pretraining run saved its final step (Orbax names dirs by step)."""
  return os.path.isdir(os.path.join(workdir, "checkpoints", str(steps)))


def epochs_for(num_examples: int, batch_size: int, study: Any) -> int:
  """Enough epochs for ``min_steps`` updates, and at least ``min_epochs``."""
  steps_per_epoch = max(1, num_examples // batch_size)
  return max(study.min_epochs, math.ceil(study.min_steps / steps_per_epoch))


def run_config(config: Any, model: str, init: str, recipe: str, num_labels: int,
               pretrained_dir: str) -> Any:
  """The fine-tuning config of one cell of the study."""
  c = copy.deepcopy(config.finetune)
  if recipe not in RECIPES:
    raise ValueError(f"config.study.recipes: unknown {recipe!r}; known: {sorted(RECIPES)}")
  spec = dict(RECIPES[recipe])
  c.adapt.scheme = spec.pop("scheme")
  c.adapt.layer_decay = spec.pop("layer_decay", 1.0)
  c.task.num_train_examples = num_labels
  c.task.pooling = config.study.pooling[model]
  num_examples = len(finetune.load_task_splits(c.task, c.seed)["train"])
  c.train.epochs = epochs_for(num_examples, c.train.batch_size, config.study)
  if spec.pop("unfreeze", False):
    c.adapt.unfreeze_epochs = c.train.epochs / (3 * (config.pretrain[model].model.num_layers + 1))
  c.optim.lr = config.study.lr[recipe]
  if init == "pretrained":
    c.init_from = pretrained_dir
  elif init == "random":
    c.model = copy.deepcopy(config.pretrain[model].model)
    c.tokenizer_path = pipeline.workdir_tokenizer(pretrained_dir).model_path
  else:
    raise ValueError(f"config.study.inits: unknown {init!r}; known: pretrained, random")
  return c


def run_study(config: Any, workdir: str) -> list[dict[str, Any]]:
  """Pretrains, fine-tunes every cell, and writes the table and the plot."""
  pretrained = _pretrain(config, workdir)
  rows = []
  for model in config.study.models:
    for init in config.study.inits:
      for recipe in config.study.recipes:
        for n in config.study.num_labels:
          run_dir = os.path.join(workdir, "finetune", f"{model}_{init}_{recipe}_{n or 'all'}")
          path = os.path.join(run_dir, "results.json")
          if not os.path.exists(path):
            start = time.time()
            c = run_config(config, model, init, recipe, n, pretrained[model])
            finetune.finetune_and_evaluate(c, run_dir)
            logging.info("%s: %.0f s", run_dir, time.time() - start)
          with open(path) as f:
            results = json.load(f)
          rows.append({"model": model, "init": init, "recipe": recipe,
                       "labels": results["train_examples"], "test": results["test"],
                       "trainable_params": results["trainable_params"]})
  with open(os.path.join(workdir, "transfer.json"), "w") as f:
    json.dump(rows, f, indent=1)
  metric = config.study.metric
  with open(os.path.join(workdir, "transfer.md"), "w") as f:
    f.write(markdown_table(rows, metric))
  plot(rows, metric, os.path.join(workdir, "transfer.png"))
  return rows


def markdown_table(rows: list[dict[str, Any]], metric: str) -> str:
  """Test ``metric`` (%) with one row per (model, init, recipe), one column
  per label budget."""
  budgets = sorted({r["labels"] for r in rows})
  lines = ["| model | init | scheme | trainable params | "
           + " | ".join(f"{n} labels" for n in budgets) + " |",
           "| --- | --- | --- | ---: |" + " ---: |" * len(budgets)]
  cells: dict[tuple, dict[int, float]] = {}
  params: dict[tuple, int] = {}
  for r in rows:
    key = (r["model"], r["init"], r["recipe"])
    cells.setdefault(key, {})[r["labels"]] = 100 * r["test"][metric]
    params[key] = r["trainable_params"]
  for key, by_n in cells.items():
    values = [f"{by_n[n]:.1f}" if n in by_n else "" for n in budgets]
    lines.append(f"| {' | '.join(key)} | {params[key]:,} | " + " | ".join(values) + " |")
  return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], metric: str, path: str) -> None:
  """Learning curves: test metric vs labeled examples, one panel per model,
  solid lines pretrained, dashed random, one colour per scheme."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  models = list(dict.fromkeys(r["model"] for r in rows))
  recipes = list(dict.fromkeys(r["recipe"] for r in rows))
  colours = dict(zip(recipes, plt.get_cmap("tab10").colors))
  fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5),
                           sharey=True, squeeze=False)
  for ax, model in zip(axes[0], models):
    for init, style in (("pretrained", "-"), ("random", "--")):
      for recipe in recipes:
        pts = sorted((r["labels"], 100 * r["test"][metric]) for r in rows
                     if (r["model"], r["init"], r["recipe"]) == (model, init, recipe))
        if pts:
          ax.plot(*zip(*pts), style, marker="o", color=colours[recipe],
                  label=f"{init} {recipe}")
    ax.set(xscale="log", title=f"{model} backbone", xlabel="labeled examples",
           ylabel=f"test {metric} (%)")
    ax.grid(alpha=0.3)
  axes[0][-1].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
