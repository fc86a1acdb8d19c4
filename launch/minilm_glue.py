r"""Fine-tune all-MiniLM-L6-v2 on GLUE tasks and print the dev-score table.

  JAXTL_DATA_DIR=../shared/data python launch/minilm_glue.py --workdir=/tmp/minilm_glue \
    --tasks=sst2,cola,mrpc,rte,stsb

One ``configs/finetune_minilm.py`` run per task (GLUE test labels are not
public, so dev is both the model-selection and the reported split, as GLUE
papers do). Finished tasks are read back from their ``results.json``.
Prints a markdown table of each task's metrics and writes ``glue.md``.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from jaxtl import layout
from jaxtl.runtime import startup

flags.DEFINE_string("workdir", "/tmp/minilm_glue", "Output folder.")
flags.DEFINE_list("tasks", ["sst2", "cola", "mrpc", "rte", "stsb"], "GLUE tasks.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_integer("epochs", 0, "Epochs (0: the task's default in configs/finetune.py).")
flags.DEFINE_enum("compute_dtype", "", ["", "float32", "bfloat16"],
                  "config.train.compute_dtype (\"\": the model's, float32).")
flags.DEFINE_bool("row_major_dots", False, "config.train.row_major_dots.")
flags.DEFINE_integer("num_train_examples", 0, "Train on a fixed random N rows of each "
                     "task (config.task.num_train_examples); 0: all of train.")
FLAGS = flags.FLAGS


def run(task: str, workdir: str) -> dict:
  path = layout.results_file(workdir)
  if not os.path.exists(path):
    from jaxtl.configs import finetune_minilm  # pylint: disable=g-import-not-at-top
    from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
    c = finetune_minilm.get_config(f"task={task}")
    c.seed, c.train.checkpoint_every = FLAGS.seed, 0
    c.train.compute_dtype, c.train.row_major_dots = FLAGS.compute_dtype, FLAGS.row_major_dots
    if FLAGS.epochs:
      c.train.epochs = FLAGS.epochs
    if FLAGS.num_train_examples:
      c.task.num_train_examples = FLAGS.num_train_examples
    finetune.finetune_and_evaluate(c, workdir)
  with open(path) as f:
    return json.load(f)


def main(argv: list[str]) -> None:
  del argv
  lines = ["| task | dev metrics | epochs | train s / epoch |", "|---|---|---:|---:|"]
  for task in FLAGS.tasks:
    r = run(task, os.path.join(FLAGS.workdir, task))
    metrics = ", ".join(f"{k} {100 * v:.1f}" for k, v in r["test"].items())
    seconds = [h["train_seconds"] for h in r["history"] if "train_seconds" in h]
    per_epoch = f"{sum(seconds) / len(seconds):.0f}" if seconds else "?"
    lines.append(f"| {task} | {metrics} | {r['epochs']} | {per_epoch} |")
    print(lines[-1], flush=True)
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(FLAGS.workdir, "glue.md"), "w") as f:
    f.write(table + "\n")


if __name__ == "__main__":
  startup.tune_process()
  app.run(main)
