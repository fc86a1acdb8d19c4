r"""Export a jaxtl checkpoint as a Hugging Face model folder.

  python -m jaxtl.convert --checkpoint=workdirs/clm --out=/tmp/clm_hf

Writes ``config.json`` + ``model.safetensors`` (GPT2LMHeadModel, BertForMaskedLM
or T5ForConditionalGeneration, by family) and the tokenizer beside them:
``tokenizer.json`` for WordPiece/BPE tokenizers, the SentencePiece model as
``spiece.model`` (what ``T5Tokenizer`` reads; other classes need their own
tokenizer files).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

flags.DEFINE_string("checkpoint", None, "A jaxtl workdir, checkpoints dir or step dir.",
                    required=True)
flags.DEFINE_string("out", None, "The folder to write.", required=True)
flags.DEFINE_string("architecture", None, "HF class (default: the richest that fits).")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  from jaxtl.train import pretrained  # pylint: disable=g-import-not-at-top
  from jaxtl.convert import export_hf  # pylint: disable=g-import-not-at-top
  from jaxtl.data.tokenizer_files import save_tokenizer  # pylint: disable=g-import-not-at-top
  loaded = pretrained.load(FLAGS.checkpoint)
  arch = export_hf(FLAGS.out, loaded.config, loaded.params, head=loaded.head,
                   architecture=FLAGS.architecture)
  save_tokenizer(loaded.tokenizer, FLAGS.out, sentencepiece_name="spiece.model")
  logging.info("wrote %s (%s) to %s", arch, loaded.config.family, FLAGS.out)


if __name__ == "__main__":
  from jaxtl import console  # pylint: disable=g-import-not-at-top
  console.quiet_libraries(sys.argv)
  app.run(main)
