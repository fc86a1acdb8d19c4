r"""``jaxtl convert``: export a jaxtl checkpoint as a Hugging Face model folder.

  jaxtl convert --checkpoint=workdirs/clm --out=/tmp/clm_hf
  jaxtl convert --checkpoint=workdirs/sst2 --out=/tmp/sst2_hf
  jaxtl convert --checkpoint=workdirs/electra --out=/tmp/gen_hf --generator

A pretraining workdir becomes GPT2LMHeadModel, BertForMaskedLM or
T5ForConditionalGeneration, by family (BertForPreTraining with an NSP / SOP
sentence head, DistilBertForMaskedLM without token types, RobertaForMaskedLM
with ``--model_type=roberta``; an ELECTRA pretrainer's discriminator
ElectraForPreTraining, and with ``--generator`` its generator
ElectraForMaskedLM). A fine-tuning workdir (one with a
``task.json``) becomes the stock task class where one computes what its head
computes (BertForSequenceClassification for BERT's pooler, the token
classifiers, QA heads and LMs), else the stock backbone plus jaxtl's head in
``modeling_jaxtl.py`` (mean, last, first or concat pooling, a scalar mix,
adapters, heads on T5's encoder; see :mod:`jaxtl.convert.task`), from the
parameters in its ``best/``, with its labels in ``config.json``. That one
loads with ``trust_remote_code=True``, e.g. the default finetune_minilm's:

  from transformers import pipeline
  classify = pipeline("text-classification", model="/tmp/sst2_hf",
                      trust_remote_code=True)

Either way ``config.json`` + ``model.safetensors`` are written, and the
tokenizer beside them, in files ``AutoTokenizer`` reads: ``tokenizer.json``
(a SentencePiece model rebuilt as one, framed as the model's inputs are, and
kept as ``spiece.model`` for ``T5Tokenizer``; see
:mod:`jaxtl.convert.hf_tokenizer`).
"""

from __future__ import annotations

from absl import flags, logging

from jaxtl import convert
from jaxtl.convert import hf_tokenizer, remote_code
from jaxtl.convert.electra import GENERATOR_CLASS
from jaxtl.convert.family import SpecialIds
from jaxtl.pretraining import pretrained
from jaxtl.models.family import family_of
from jaxtl.tasks import features, predictor, spec

flags.DEFINE_string("checkpoint", None, "A jaxtl workdir, checkpoints dir or step dir.",
                    required=True)
flags.DEFINE_string("out", None, "The folder to write.", required=True)
flags.DEFINE_string("architecture", None, "HF class (default: the richest that fits; "
                    "a fine-tuning workdir's is set by its task, and naming one "
                    "exports its tuned backbone, e.g. BertModel).")
flags.DEFINE_string("model_type", None, "HF family of an encoder: bert (default), "
                    "roberta or distilbert (default for one without token types).")
flags.DEFINE_bool("generator", False, "An ELECTRA pretraining workdir: export its "
                  "generator as ElectraForMaskedLM (default: its discriminator, "
                  "as ElectraForPreTraining).")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  if spec.exists(FLAGS.checkpoint) and not FLAGS.architecture and not FLAGS.generator:
    # best/, LoRA merged; float32: an export computes nothing, so neither
    # auto's choice nor its log line is this command's.
    tuned = predictor.load(FLAGS.checkpoint, compute_dtype="float32")
    arch = convert.export_task_hf(FLAGS.out, tuned.config, tuned.params, tuned.spec,
                                  tokenizer=tuned.tokenizer, model_type=FLAGS.model_type)
    # A task's inputs, framed as in fine-tuning (GPT-2's too: a ... <eos>).
    frame = features.frame(tuned.tokenizer, tuned.config.family)
    tokenizer, model = tuned.tokenizer, tuned.config
  else:
    if FLAGS.generator:
      loaded = pretrained.load_generator(FLAGS.checkpoint)
      architecture = FLAGS.architecture or GENERATOR_CLASS
    else:
      loaded, architecture = pretrained.load(FLAGS.checkpoint), FLAGS.architecture
    try:
      arch = convert.export_hf(FLAGS.out, loaded.config, loaded.params, head=loaded.head,
                               architecture=architecture, model_type=FLAGS.model_type,
                               special_ids=SpecialIds.of(loaded.tokenizer))
    except ValueError as e:
      if not FLAGS.generator:
        raise
      g = loaded.config  # HF's heads are hidden_size / num_attention_heads wide
      raise ValueError(f"{FLAGS.checkpoint}'s generator ({g.num_heads} heads of "
                       f"{g.head_dim} over width {g.d_model}, per "
                       f"config.objective.generator_scale): {e}") from e
    tokenizer, model = loaded.tokenizer, loaded.config
    frame = (None if family_of(model).causal  # an LM continues its prompt
             else features.frame(tokenizer, model.family))
  hf_tokenizer.save(tokenizer, FLAGS.out, frame, token_types=model.type_vocab_size > 1,
                    own_model_type=arch in remote_code.CLASSES)
  logging.info("wrote %s to %s%s", arch, FLAGS.out,
               " (load it with trust_remote_code=True)" if arch in remote_code.CLASSES
               else "")

