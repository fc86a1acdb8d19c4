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

import numpy as np

from jaxtl.pretraining import pretrain
from jaxtl.tasks import finetune
from jaxtl import layout
from jaxtl.data import tokenizer_files

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
      metrics = pretrain.train_and_evaluate(pre, dirs[name])
      logging.info("pretraining %s: %s (%.0f s)", name, metrics, time.time() - start)
    if not tokenizer:
      tokenizer = tokenizer_files.workdir_tokenizer(dirs[name]).model_path
  return dirs


def _finished(workdir: str, steps: int) -> bool:
  """Whether a pretraining run saved its final step (Orbax names dirs by step)."""
  return os.path.isdir(os.path.join(layout.checkpoints(workdir), str(steps)))


def epochs_for(num_examples: int, batch_size: int, study: Any) -> int:
  """Enough epochs for ``min_steps`` updates, and at least ``min_epochs``."""
  steps_per_epoch = max(1, num_examples // batch_size)
  return max(study.min_epochs, math.ceil(study.min_steps / steps_per_epoch))


def run_config(config: Any, model: str, init: str, recipe: str, num_labels: int,
               pretrained_dir: str, lr: float, seed: int) -> Any:
  """The fine-tuning config of one run of the study."""
  c = copy.deepcopy(config.finetune)
  if recipe not in RECIPES:
    raise ValueError(f"config.study.recipes: unknown {recipe!r}; known: {sorted(RECIPES)}")
  spec = dict(RECIPES[recipe])
  c.seed = seed  # draws the labeled subset as well as the initialisation
  c.adapt.scheme = spec.pop("scheme")
  c.adapt.layer_decay = spec.pop("layer_decay", 1.0)
  c.task.num_train_examples = num_labels
  c.task.pooling = config.study.pooling[model]
  num_examples = len(finetune.load_task_splits(c.task, c.seed)["train"])
  c.train.epochs = epochs_for(num_examples, c.train.batch_size, config.study)
  c.train.checkpoint_every = 0  # minutes-long runs: a stopped one just reruns
  if spec.pop("unfreeze", False):
    c.adapt.unfreeze_epochs = c.train.epochs / (3 * (config.pretrain[model].model.num_layers + 1))
  c.optim.lr = lr
  if init == "pretrained":
    c.init_from = pretrained_dir
  elif init == "random":
    c.model = copy.deepcopy(config.pretrain[model].model)
    c.tokenizer_path = tokenizer_files.workdir_tokenizer(pretrained_dir).model_path
  else:
    raise ValueError(f"config.study.inits: unknown {init!r}; known: pretrained, random")
  return c


def learning_rates(study: Any, recipe: str) -> tuple[float, ...]:
  """The recipe's learning-rate grid (a single value is a grid of one)."""
  lrs = study.lr[recipe]
  return tuple(lrs) if isinstance(lrs, (tuple, list)) else (lrs,)


def _run(config: Any, run_dir: str, *args: Any) -> dict[str, Any]:
  """One fine-tuning run, or its results if it finished before."""
  path = layout.results_file(run_dir)
  if not os.path.exists(path):
    start = time.time()
    finetune.finetune_and_evaluate(run_config(config, *args), run_dir)
    logging.info("%s: %.0f s", run_dir, time.time() - start)
  with open(path) as f:
    return json.load(f)


def run_study(config: Any, workdir: str) -> list[dict[str, Any]]:
  """Pretrains, fine-tunes every cell, and writes the table and the plot.

  Each (model, init, recipe, budget) cell is run once per seed. Within a
  seed, the learning rate is chosen from the recipe's grid by the dev
  metric, separately for each init: a random init usually wants a
  different rate than a pretrained one, and comparing both at one rate
  would favour whichever that rate happens to suit.
  """
  pretrained = _pretrain(config, workdir)
  rows = []
  for model in config.study.models:
    for init in config.study.inits:
      for recipe in config.study.recipes:
        for n in config.study.num_labels:
          for seed in config.study.seeds:
            cell = os.path.join(workdir, "finetune", f"{model}_{init}_{recipe}_{n or 'all'}")
            runs = {lr: _run(config, os.path.join(cell, f"seed{seed}_lr{lr:g}"), model,
                             init, recipe, n, pretrained[model], lr, seed)
                    for lr in learning_rates(config.study, recipe)}
            lr, best = max(runs.items(), key=lambda kv: kv[1]["best_dev"])
            rows.append({"model": model, "init": init, "recipe": recipe,
                         "labels": best["train_examples"], "seed": seed, "lr": lr,
                         "dev": best["best_dev"], "test": best["test"],
                         "trainable_params": best["trainable_params"]})
  with open(os.path.join(workdir, "transfer.json"), "w") as f:
    json.dump(rows, f, indent=1)
  metric = config.study.metric
  with open(os.path.join(workdir, "transfer.md"), "w") as f:
    f.write(markdown_table(rows, metric))
  plot(rows, metric, os.path.join(workdir, "transfer.png"))
  return rows


def _by_cell(rows: list[dict[str, Any]], metric: str) -> dict[tuple, dict[int, np.ndarray]]:
  """(model, init, recipe) -> budget -> test metric (%) of each seed."""
  cells: dict[tuple, dict[int, list[float]]] = {}
  for r in rows:
    key = (r["model"], r["init"], r["recipe"])
    cells.setdefault(key, {}).setdefault(r["labels"], []).append(100 * r["test"][metric])
  return {k: {n: np.asarray(v) for n, v in by_n.items()} for k, by_n in cells.items()}


def _std(values: np.ndarray) -> float:
  """Sample standard deviation over seeds (0 for a single seed)."""
  return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def _mean_std(values: np.ndarray | None) -> str:
  if values is None:
    return ""
  if len(values) == 1:
    return f"{values[0]:.1f}"
  return f"{values.mean():.1f} ± {_std(values):.1f}"


def markdown_table(rows: list[dict[str, Any]], metric: str) -> str:
  """Test ``metric`` (%) with one row per (model, init, recipe), one column
  per label budget: the mean ± standard deviation over seeds; then the gain
  of pretrained over random init, per budget (paired by seed)."""
  budgets = sorted({r["labels"] for r in rows})
  header = " | ".join(f"{n} labels" for n in budgets)
  align = " ---: |" * len(budgets)
  cells = _by_cell(rows, metric)
  params = {(r["model"], r["init"], r["recipe"]): r["trainable_params"] for r in rows}
  seeds = len({r["seed"] for r in rows})
  lines = [f"Test {metric} (%), mean ± std over {seeds} seed(s).", "",
           f"| model | init | scheme | trainable params | {header} |",
           f"| --- | --- | --- | ---: |{align}"]
  for key, by_n in cells.items():
    values = [_mean_std(by_n.get(n)) for n in budgets]
    lines.append(f"| {' | '.join(key)} | {params[key]:,} | " + " | ".join(values) + " |")
  gains = []
  for (model, init, recipe), by_n in cells.items():
    random = cells.get((model, "random", recipe))
    if init != "pretrained" or random is None:
      continue
    values = [_mean_std(by_n[n] - random[n])
              if n in by_n and n in random and len(by_n[n]) == len(random[n]) else ""
              for n in budgets]
    gains.append(f"| {model} | {recipe} | " + " | ".join(values) + " |")
  if gains:
    lines += ["", f"Pretrained minus random init, {metric} points:", "",
              f"| model | scheme | {header} |", f"| --- | --- |{align}"] + gains
  return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], metric: str, path: str) -> None:
  """Learning curves: test metric vs labeled examples, one panel per model,
  solid lines pretrained, dashed random, one colour per scheme; the bars
  span one standard deviation over seeds."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  cells = _by_cell(rows, metric)
  models = list(dict.fromkeys(r["model"] for r in rows))
  recipes = list(dict.fromkeys(r["recipe"] for r in rows))
  colours = dict(zip(recipes, plt.get_cmap("tab10").colors))
  fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5),
                           sharey=True, squeeze=False)
  for ax, model in zip(axes[0], models):
    for init, style in (("pretrained", "-"), ("random", "--")):
      for recipe in recipes:
        by_n = cells.get((model, init, recipe))
        if by_n:
          budgets = sorted(by_n)
          ax.errorbar(budgets, [by_n[n].mean() for n in budgets],
                      yerr=[_std(by_n[n]) for n in budgets], fmt=style, marker="o",
                      capsize=2, color=colours[recipe], label=f"{init} {recipe}")
    ax.set(xscale="log", title=f"{model} backbone", xlabel="labeled examples",
           ylabel=f"test {metric} (%)")
    ax.grid(alpha=0.3)
  axes[0][-1].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
