r"""``jaxtl predict``: predict with a fine-tuned model: a file (or stdin) in, predictions out.

  jaxtl predict --workdir=workdirs/trec_full --input=questions.txt \
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

from absl import app, flags, logging

from jaxtl.programs import precision
from jaxtl.tasks import file_predictions

flags.DEFINE_string("workdir", None, "A fine-tuning workdir.", required=True)
flags.DEFINE_string("input", None, "Rows to predict (a file, or - for stdin).",
                    required=True)
flags.DEFINE_string("output", "-", "Where predictions go (- for stdout).")
flags.DEFINE_list("text_fields", [], "The input columns holding the task's "
                  "texts, in the task's order (default: the task's field names).")
flags.DEFINE_enum("input_format", "", ["", "csv", "tsv", "tsv_unquoted", "jsonl", "parquet",
                                       "text"],
                  "Default: by --input's extension (plain text otherwise).")
flags.DEFINE_integer("batch_size", 32, "Rows per forward pass.", lower_bound=1)
precision.define_compute_dtype(__name__, "what fine-tuning was asked, and auto "
                               "decides again on this machine")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  n = file_predictions.predict_file(FLAGS.workdir, FLAGS.input, FLAGS.output,
                                    FLAGS.text_fields, FLAGS.input_format,
                                    FLAGS.batch_size, FLAGS.compute_dtype or None)
  logging.info("predicted %d row%s -> %s", n, "" if n == 1 else "s", FLAGS.output)
