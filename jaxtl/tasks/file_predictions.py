"""A fine-tuned model's predictions for a file of rows (``jaxtl predict``):
every row checked before the model loads, written in the input's order
with the input's fields beside the prediction."""

from __future__ import annotations

import logging
from collections.abc import Collection

from jaxtl.tasks import predictor
from jaxtl.tasks import rows as rows_lib
from jaxtl.tasks import spec as task_spec
from jaxtl.train import metrics


def predict_file(workdir: str, input_path: str, output_path: str = "-",
                 text_fields: list[str] | tuple[str, ...] = (), input_format: str = "",
                 batch_size: int = 32, compute_dtype: str | None = None) -> int:
  """Predicts every row of ``input_path`` into ``output_path``; returns the
  number of rows. Every row is checked before the model is loaded, which
  computes in ``compute_dtype`` (:func:`jaxtl.tasks.predictor.load`)."""
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
  model = predictor.load(workdir, compute_dtype)
  # Rows between writes; the bar moves per chunk. Within a chunk rows are
  # batched by length, so a larger chunk pads less. A run stopped halfway
  # leaves --output as it was (the Writer's file takes its name at the end).
  chunk = 32 * batch_size
  with (rows_lib.Writer(output_path, columns=fields) as writer,
        metrics.progress_bar(total=len(inputs), desc="predict", unit="row") as bar):
    for start in range(0, len(inputs), chunk):
      preds = model.predict(inputs[start:start + chunk], batch_size=batch_size, desc=None)
      for (_, row), pred in zip(rows[start:start + chunk], preds):
        writer.write(with_prediction(row, pred, fields))
      bar.update(len(preds))
  return len(inputs)


def with_prediction(row: dict, pred: dict, fields: Collection[str]) -> dict:
  """The input row plus the prediction, which never overwrites an input
  field: when any input row has a field of a prediction's name (``fields``:
  every input row's; a gold ``label``), the prediction's fields are all
  named ``predicted_*`` (``predicted_predicted_*`` if those are taken too),
  on every row alike, so a column means one thing. A table's
  ``probabilities.NAME`` columns (an earlier output read back) take
  ``probabilities``'s name too."""
  taken = {*fields, *(f.split(".", 1)[0] for f in fields)}
  prefix = ""
  while any(prefix + k in taken for k in pred):
    prefix = "predicted_" + prefix
  return {**row, **{prefix + k: v for k, v in pred.items()}}
