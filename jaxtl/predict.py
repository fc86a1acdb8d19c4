r"""Predict with a fine-tuned model: a file (or stdin) in, predictions out.

  python -m jaxtl.predict --workdir=workdirs/trec_full --input=questions.txt \
    --output=predictions.jsonl
  jaxtl predict --workdir=workdirs/mrpc --input=pairs.tsv \
    --text_fields=sentence1,sentence2 --output=out.tsv
  echo "Who wrote Hamlet?" | jaxtl predict --workdir=workdirs/trec_full --input=-

``--input``: CSV, TSV (header line naming the columns), JSON lines, Parquet, or plain
text (one text per line; any other extension, and stdin unless
``--input_format`` says otherwise). ``--text_fields`` names the columns that
hold the task's inputs, in the task's order (default: the columns the model
was trained on, for ``task=files``; else the task's own names, ``text`` /
``text``,``text_pair`` / ``words`` / ``question``,``context``; see
``task.json``). Each output row is the input row plus the prediction (JSON
lines; CSV / TSV when ``--output`` ends so, with every input row's fields
as columns; stdout, ``-``, by default), one per input row, in order: a
blank line or an empty cell is predicted as an empty text. When an input
row already has a field of the prediction's name (a gold ``label``), the
prediction's fields are ``predicted_label`` etc. on every row.
"""

from __future__ import annotations

import sys
from collections.abc import Collection

from absl import app, flags, logging


def _define_flags() -> None:
  """Defined only when run as a program: importing this module (for
  :func:`predict_file`) must not add required flags to absl's global set."""
  flags.DEFINE_string("workdir", None, "A fine-tuning workdir.", required=True)
  flags.DEFINE_string("input", None, "Rows to predict (a file, or - for stdin).",
                      required=True)
  flags.DEFINE_string("output", "-", "Where predictions go (- for stdout).")
  flags.DEFINE_list("text_fields", [], "The input columns holding the task's "
                    "texts, in the task's order (default: the task's field names).")
  flags.DEFINE_enum("input_format", "", ["", "csv", "tsv", "jsonl", "parquet", "text"],
                    "Default: by --input's extension (plain text otherwise).")
  flags.DEFINE_integer("batch_size", 32, "Rows per forward pass.")


FLAGS = flags.FLAGS


def predict_file(workdir: str, input_path: str, output_path: str = "-",
                 text_fields: list[str] | tuple[str, ...] = (), input_format: str = "",
                 batch_size: int = 32) -> int:
  """Predicts every row of ``input_path`` into ``output_path``; returns the
  number of rows. Every row is checked before the model is loaded."""
  from jaxtl.tasks import predictor  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import rows as rows_lib  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import spec as task_spec  # pylint: disable=g-import-not-at-top
  from jaxtl.train import metrics  # pylint: disable=g-import-not-at-top

  spec = task_spec.load(workdir)
  fmt = rows_lib.format_of(input_path, input_format)
  name = "<stdin>" if input_path == "-" else input_path
  if fmt == "text" and len(spec.text_fields) > 1:
    raise ValueError(f"{name}: plain text holds one text per line, and the task "
                     f"{spec.name!r} takes {list(spec.text_fields)}: use CSV, TSV "
                     "or JSON lines")
  columns = tuple(text_fields) or ((rows_lib.TEXT_FIELD,) if fmt == "text"
                                   else spec.columns or spec.text_fields)
  if len(columns) != len(spec.text_fields):
    raise ValueError(f"--text_fields={','.join(columns)}: the task {spec.name!r} "
                     f"takes {len(spec.text_fields)} field(s) {list(spec.text_fields)}")
  rows = rows_lib.read_rows(input_path, fmt)
  fields = rows_lib.fields_of(rows)
  inputs = [dict(zip(spec.text_fields, values))
            for values in rows_lib.pick(rows, columns, name)]
  empty = sum(any(isinstance(v, str) and not v.strip() for v in item.values())
              for item in inputs)
  if empty:
    logging.warning("%s: %d row(s) with an empty text (a blank line or cell), "
                    "each predicted on its empty text", name, empty)
  model = predictor.load(workdir)
  writer = rows_lib.Writer(output_path, columns=fields)
  chunk = 4 * batch_size  # rows between writes; the bar moves per chunk
  try:
    with metrics.progress_bar(total=len(inputs), desc="predict", unit="row") as bar:
      for start in range(0, len(inputs), chunk):
        preds = model.predict(inputs[start:start + chunk], batch_size=batch_size)
        for (_, row), pred in zip(rows[start:start + chunk], preds):
          writer.write(with_prediction(row, pred, fields))
        bar.update(len(preds))
  finally:
    writer.close()
  return len(inputs)


def with_prediction(row: dict, pred: dict, fields: Collection[str]) -> dict:
  """The input row plus the prediction, which never overwrites an input
  field: when any input row has a field of a prediction's name (``fields``:
  every input row's; a gold ``label``), the prediction's fields are all
  named ``predicted_*`` (``predicted_predicted_*`` if those are taken too),
  on every row alike, so a column means one thing."""
  prefix = ""
  while any(prefix + k in fields for k in pred):
    prefix = "predicted_" + prefix
  return {**row, **{prefix + k: v for k, v in pred.items()}}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  n = predict_file(FLAGS.workdir, FLAGS.input, FLAGS.output, FLAGS.text_fields,
                   FLAGS.input_format, FLAGS.batch_size)
  logging.info("predicted %d rows -> %s", n, FLAGS.output)


if __name__ == "__main__":
  from jaxtl import console, startup  # pylint: disable=g-import-not-at-top
  console.quiet_libraries(sys.argv)
  startup.tune_process()
  _define_flags()
  console.run(main)
