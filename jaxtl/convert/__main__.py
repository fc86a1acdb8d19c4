r"""Export a jaxtl checkpoint as a Hugging Face model folder.

  python -m jaxtl.convert --checkpoint=workdirs/clm --out=/tmp/clm_hf
  python -m jaxtl.convert --checkpoint=workdirs/sst2 --out=/tmp/sst2_hf

A pretraining workdir becomes GPT2LMHeadModel, BertForMaskedLM or
T5ForConditionalGeneration, by family. A fine-tuning workdir (one with a
``task.json``) becomes the task class computing what its head computes
(BertForSequenceClassification, GPT2ForTokenClassification, ...; see
:mod:`jaxtl.convert.task`), from the parameters in its ``best/``, with its
labels in ``config.json``. Either way ``config.json`` + ``model.safetensors``
are written, and the tokenizer beside them: ``tokenizer.json`` for
WordPiece/BPE tokenizers, the SentencePiece model as ``spiece.model`` (what
``T5Tokenizer`` reads; other classes need their own tokenizer files).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

flags.DEFINE_string("checkpoint", None, "A jaxtl workdir, checkpoints dir or step dir.",
                    required=True)
flags.DEFINE_string("out", None, "The folder to write.", required=True)
flags.DEFINE_string("architecture", None, "HF class (default: the richest that fits; "
                    "a fine-tuning workdir's is set by its task).")
FLAGS = flags.FLAGS


def export_task_workdir(workdir: str, out: str) -> tuple[str, object]:
  """Exports a fine-tuning workdir's best parameters; (class, tokenizer)."""
  from jaxtl import convert  # pylint: disable=g-import-not-at-top
  from jaxtl.data import pipeline  # pylint: disable=g-import-not-at-top
  from jaxtl.train import checkpoint, pretrained  # pylint: disable=g-import-not-at-top
  best = os.path.join(workdir, "best")
  if not os.path.isdir(best):
    raise FileNotFoundError(f"{workdir} has a task.json but no best/ checkpoint")
  tokenizer = pipeline.workdir_tokenizer(workdir)
  arch = convert.export_task_hf(out, pretrained.load_model_config(workdir),
                                checkpoint.load_params(best),
                                convert.load_task_spec(workdir), tokenizer=tokenizer)
  return arch, tokenizer


def main(argv: list[str]) -> None:
  del argv
  from jaxtl.train import pretrained  # pylint: disable=g-import-not-at-top
  from jaxtl import convert  # pylint: disable=g-import-not-at-top
  from jaxtl.data.tokenizer_files import save_tokenizer  # pylint: disable=g-import-not-at-top
  if convert.is_task_workdir(FLAGS.checkpoint):
    if FLAGS.architecture:
      raise app.UsageError("--architecture: a fine-tuning workdir's class follows "
                           "from its task.json")
    arch, tokenizer = export_task_workdir(FLAGS.checkpoint, FLAGS.out)
  else:
    loaded = pretrained.load(FLAGS.checkpoint)
    arch = convert.export_hf(FLAGS.out, loaded.config, loaded.params, head=loaded.head,
                             architecture=FLAGS.architecture)
    tokenizer = loaded.tokenizer
  save_tokenizer(tokenizer, FLAGS.out, sentencepiece_name="spiece.model")
  logging.info("wrote %s to %s", arch, FLAGS.out)


if __name__ == "__main__":
  from jaxtl import console  # pylint: disable=g-import-not-at-top
  console.quiet_libraries(sys.argv)
  app.run(main)
