r"""Fine-tune a pretrained jaxtl model (or a random one) on a labeled task.

Command (after ``pretrain_mlm`` wrote /tmp/mlm):

  JAXTL_DATA_DIR=../shared/data jaxtl finetune \
    --config=finetune:task=trec,scheme=full \
    --config.init_from=/tmp/mlm --workdir=/tmp/trec_full

Tasks: trec, sst2, cola, mrpc, rte, stsb (regression), imdb, pos (UD EWT
UPOS tagging), squad (extractive QA on article halves of SQuAD dev, long
contexts in windows of ``max_len`` tokens every ``doc_stride``), and files:
your own CSV, TSV, JSON lines or Parquet (``jaxtl.tasks.file_task``):

  jaxtl finetune --config=finetune:task=files \
    --config.task.train=train.csv --config.task.dev_fraction=0.1 \
    --config.task.text_fields=review --config.task.label_field=stars ... On a T5
backbone (``pretrain_span``), ``--config.task.kind=text_to_text``
turns a classification task into T5's text-to-text form: the decoder learns
to write the label (``task.label_words``) and predicts the likeliest one.
``--config.task.kind=generation`` (T5, BART or GPT-2 backbones) trains the LM to
write free text (``task.label_field``: the target, or a list of references)
and scores what it decodes (ROUGE, BLEU, exact match, F1; docs: guides/generative); ``task=squad`` with it is SQuAD as "question: ... context: ..."
-> answer, scored by exact match and F1.
Schemes: full, features (frozen backbone + linear probe),
scalar_mix (probe on an ELMo mix of all layers), adapters, lora; ULMFiT
switches: ``--config.adapt.layer_decay=0.8`` (discriminative learning rates)
and ``--config.adapt.unfreeze_epochs=1`` (gradual unfreezing, top first: one
more layer every that many epochs, fractions allowed); the paper's whole
recipe (concat pooling, 1/2.6 per layer, STLR, its LM stage) is
``ulmfit``.
Without ``init_from`` the backbone is randomly initialised from
``config.model`` (``:model=bert_tiny``) and needs ``config.tokenizer_path``.
Writes results.json (dev history, best dev, test metrics) in the workdir.
"""

from jaxtl.configs import common
from jaxtl.runtime import console

# task -> (head kind, max length, epochs)
TASKS = {
    "trec": ("classification", 64, 3),
    "sst2": ("classification", 64, 2),
    "cola": ("classification", 64, 3),
    "mrpc": ("classification", 128, 3),
    "rte": ("classification", 128, 3),
    "stsb": ("regression", 128, 3),
    "imdb": ("classification", 256, 2),
    "pos": ("token_classification", 128, 3),
    "squad": ("span_qa", 256, 2),
    # Your own CSV / TSV / JSON lines / Parquet files (docs: guides/own-data): --config.task.train=PATH --config.task.text_fields=text
    # --config.task.label_field=label, and dev/test files or fractions.
    "files": ("classification", 128, 3),
}

# Words for label codes, for text-to-text models to write.
LABEL_WORDS = {"trec": ("abbreviation", "description", "entity", "human",
                        "location", "number")}


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, task="trec", scheme="full", model="bert_tiny")
  if args.task not in TASKS:
    raise ValueError(console.unknown("task", args.task, sorted(TASKS)))
  kind, max_len, epochs = TASKS[args.task]
  c = common.finetune_config(args.model)
  # task=files is scored by its kind's metrics (it may be changed on the
  # command line: --config.task.kind=regression).
  metrics = "" if args.task == "files" else args.task
  c.task.update(name=args.task, kind=kind, metrics=metrics, max_len=max_len,
                label_words=LABEL_WORDS.get(args.task, ()))
  if args.task == "squad":  # kind=generation writes them into its input text
    c.task.text_fields = ("question", "context")
  c.adapt.scheme = args.scheme
  c.optim.lr = 2e-4 if args.scheme == "full" else 1e-3
  c.train.epochs = epochs
  return c
