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

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any

import ml_collections
import numpy as np

from jaxtl import layout, sections
from jaxtl.data import tokenizer_files
from jaxtl.pretraining import pretrain
from jaxtl.pretraining.config import PretrainConfig
from jaxtl.tasks import finetune
from jaxtl.tasks.config import FinetuneConfig, StudyConfig, TransferStudyConfig

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


def of(config: TransferStudyConfig | ml_collections.ConfigDict) -> TransferStudyConfig:
  """The typed config of configs/transfer_study.py's ConfigDict (a typed one
  is returned as it is)."""
  if isinstance(config, TransferStudyConfig):
    return config
  return sections.build(TransferStudyConfig, config)


def _with_tokenizer(pre: PretrainConfig, path: str) -> PretrainConfig:
  """``pre`` reading the tokenizer at ``path``, in every stage as well."""
  def data(d):
    return dataclasses.replace(d, tokenizer=dataclasses.replace(d.tokenizer, path=path))
  return dataclasses.replace(pre, data=data(pre.data), stages=tuple(
      dataclasses.replace(s, data=data(s.data)) for s in pre.stages))


def _pretrain(config: TransferStudyConfig, workdir: str) -> dict[str, str]:
  """Runs (or resumes) every pretraining; returns name -> workdir."""
  dirs: dict[str, str] = {}
  tokenizer = ""
  for name in config.study.models:
    pre = config.pretrain[name]
    if tokenizer:
      pre = _with_tokenizer(pre, tokenizer)
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


def epochs_for(num_examples: int, batch_size: int, study: StudyConfig) -> int:
  """Enough epochs for ``min_steps`` updates, and at least ``min_epochs``."""
  steps_per_epoch = max(1, num_examples // batch_size)
  return max(study.min_epochs, math.ceil(study.min_steps / steps_per_epoch))


def run_config(config: TransferStudyConfig, model: str, init: str, recipe: str,
               num_labels: int, pretrained_dir: str, lr: float, seed: int
               ) -> FinetuneConfig:
  """The fine-tuning config of one run of the study."""
  base, study = config.finetune, config.study
  if recipe not in RECIPES:
    raise ValueError(f"config.study.recipes: unknown {recipe!r}; known: {sorted(RECIPES)}")
  if init not in ("pretrained", "random"):
    raise ValueError(f"config.study.inits: unknown {init!r}; known: pretrained, random")
  spec = dict(RECIPES[recipe])
  task = dataclasses.replace(base.task, num_train_examples=num_labels,
                             pooling=study.pooling[model])
  # The seed draws the labeled subset as well as the initialisation.
  num_examples = len(finetune.load_task_splits(task, seed)["train"])
  epochs = epochs_for(num_examples, base.train.batch_size, study)
  adapt = dataclasses.replace(base.adapt, scheme=spec.pop("scheme"),
                              layer_decay=spec.pop("layer_decay", 1.0))
  backbone = config.pretrain[model].model
  if spec.pop("unfreeze", False):
    adapt = dataclasses.replace(
        adapt, unfreeze_epochs=epochs / (3 * (backbone["num_layers"] + 1)))
  c = dataclasses.replace(
      base, seed=seed, task=task, adapt=adapt, optim=dataclasses.replace(base.optim, lr=lr),
      # minutes-long runs: a stopped one just reruns
      train=dataclasses.replace(base.train, epochs=epochs, checkpoint_every=0.0))
  if init == "pretrained":
    return dataclasses.replace(c, init_from=pretrained_dir)
  return dataclasses.replace(
      c, model=dict(backbone),
      tokenizer_path=tokenizer_files.workdir_tokenizer(pretrained_dir).model_path)


def learning_rates(study: StudyConfig, recipe: str) -> tuple[float, ...]:
  """The recipe's learning-rate grid (a single value is a grid of one)."""
  lrs = study.lr[recipe]
  return tuple(lrs) if isinstance(lrs, (tuple, list)) else (lrs,)


def _run(config: TransferStudyConfig, run_dir: str, *args: Any) -> dict[str, Any]:
  """One fine-tuning run, or its results if it finished before."""
  path = layout.results_file(run_dir)
  if not os.path.exists(path):
    start = time.time()
    finetune.finetune_and_evaluate(run_config(config, *args), run_dir)
    logging.info("%s: %.0f s", run_dir, time.time() - start)
  with open(path) as f:
    return json.load(f)


def run_study(config: TransferStudyConfig | ml_collections.ConfigDict, workdir: str
              ) -> list[dict[str, Any]]:
  """Pretrains, fine-tunes every cell, and writes the table and the plot.

  ``config`` is typed, or configs/transfer_study.py's ConfigDict (as ``jaxtl
  study`` holds it), typed here once (:func:`of`): the boundary where it is
  read. Each run of the study gets its typed config, derived from it.

  Each (model, init, recipe, budget) cell is run once per seed. Within a
  seed, the learning rate is chosen from the recipe's grid by the dev
  metric, separately for each init: a random init usually wants a
  different rate than a pretrained one, and comparing both at one rate
  would favour whichever that rate happens to suit.
  """
  config = of(config)
  study = config.study
  pretrained = _pretrain(config, workdir)
  rows = []
  for model in study.models:
    for init in study.inits:
      for recipe in study.recipes:
        for n in study.num_labels:
          for seed in study.seeds:
            cell = os.path.join(workdir, "finetune", f"{model}_{init}_{recipe}_{n or 'all'}")
            runs = {lr: _run(config, os.path.join(cell, f"seed{seed}_lr{lr:g}"), model,
                             init, recipe, n, pretrained[model], lr, seed)
                    for lr in learning_rates(study, recipe)}
            lr, best = max(runs.items(), key=lambda kv: kv[1]["best_dev"])
            rows.append({"model": model, "init": init, "recipe": recipe,
                         "labels": best["train_examples"], "seed": seed, "lr": lr,
                         "dev": best["best_dev"], "test": best["test"],
                         "trainable_params": best["trainable_params"]})
  with open(os.path.join(workdir, "transfer.json"), "w") as f:
    json.dump(rows, f, indent=1)
  with open(os.path.join(workdir, "transfer.md"), "w") as f:
    f.write(markdown_table(rows, study.metric))
  plot(rows, study.metric, os.path.join(workdir, "transfer.png"))
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
  # optional (jaxtl[analysis]) and slow to import: only the figure needs it
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
