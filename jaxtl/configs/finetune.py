r"""Fine-tune a pretrained jaxtl model (or a random one) on a labeled task.

Command (after ``configs/pretrain_mlm.py`` wrote /tmp/mlm):

  JAXTL_DATA_DIR=../shared/data python -m jaxtl.main --mode=finetune \
    --config=configs/finetune.py:task=trec,scheme=full \
    --config.init_from=/tmp/mlm --workdir=/tmp/trec_full

Tasks: trec, sst2, cola, mrpc, rte, stsb (regression), imdb, pos (UD EWT
UPOS tagging), squad (extractive QA on article halves of SQuAD dev, long
contexts in windows of ``max_len`` tokens every ``doc_stride``). On a T5
backbone (``configs/pretrain_span.py``), ``--config.task.kind=text_to_text``
turns a classification task into T5's text-to-text form: the decoder learns
to write the label (``task.label_words``) and predicts the likeliest one.
Schemes: full, features (frozen backbone + linear probe),
scalar_mix (probe on an ELMo mix of all layers), adapters, lora; ULMFiT
switches: ``--config.adapt.layer_decay=0.8`` (discriminative learning rates)
and ``--config.adapt.unfreeze_epochs=1`` (gradual unfreezing, top first: one
more layer every that many epochs, fractions allowed).
Without ``init_from`` the backbone is randomly initialised from
``config.model`` (``:model=bert_tiny``) and needs ``config.tokenizer_path``.
Writes results.json (dev history, best dev, test metrics) in the workdir.
"""

import ml_collections

from jaxtl.configs import common, models

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
}

# Words for label codes, for text-to-text models to write.
LABEL_WORDS = {"trec": ("abbreviation", "description", "entity", "human",
                        "location", "number")}


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, task="trec", scheme="full", model="bert_tiny")
  if args.task not in TASKS:
    raise ValueError(f"unknown task {args.task!r}; known: {sorted(TASKS)}")
  kind, max_len, epochs = TASKS[args.task]
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.init_from = ""  # a pretraining workdir
  c.tokenizer_path = ""  # default: the one in init_from/tokenizer/
  c.model = models.get_model_config(args.model)  # only used without init_from
  c.vocab_multiple = 128
  c.task = ml_collections.ConfigDict(dict(
      name=args.task, kind=kind, metrics=args.task, max_len=max_len,
      # first ([CLS]) | last (last non-padding token) | mean | pooler
      # ([CLS] + BERT's dense + tanh, loaded from HF BERT checkpoints) | ""
      # (the backbone's default: first for BERT-style encoders, mean otherwise)
      pooling="",
      # Held out of train for model selection when the task has no dev
      # split; 0: train on all of train and report the last epoch.
      dev_fraction=0.1,
      num_train_examples=0,  # 0: all; else a fixed random subset
      max_eval_examples=0,  # 0: all; else the first N of dev and test (quick looks)
      on_error="raise", head_dropout=0.1,
      doc_stride=128, max_answer_tokens=30,  # span_qa only
      # text_to_text (T5 backbones, classification tasks): the text written
      # for each class; empty: the label names.
      label_words=LABEL_WORDS.get(args.task, ())))
  c.adapt = ml_collections.ConfigDict(dict(
      scheme=args.scheme, freeze=(), layer_decay=1.0, unfreeze_epochs=0.0,
      adapter_dim=16, lora_rank=8, lora_alpha=16.0, lora_dropout=0.0,
      lora_targets=("query", "value"), dropout_rate=0.1,
      attention_dropout_rate=0.0))
  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-3 if args.scheme != "full" else 2e-4, warmup_steps=50,
      warmup_fraction=0.0,  # used when warmup_steps is 0: a share of all steps
      schedule="linear", end_lr_ratio=0.0, weight_decay=0.01, b1=0.9, b2=0.999,
      eps=1e-8, clip_norm=1.0, accum_steps=1))
  c.train = ml_collections.ConfigDict(dict(
      epochs=epochs, batch_size=32,
      # Each batch is cut to its longest text rounded up to this many tokens
      # (0: always max_len); a few shapes to compile, far less padding.
      length_multiple=16,
      log_every=50,  # steps between train-loss lines
      # Epochs between resumable checkpoints (fractions save mid-epoch);
      # 0: none but the last and on SIGTERM.
      checkpoint_every=1.0,
      max_bad_steps=20))  # consecutive non-finite steps that stop the run
  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)
  c.mesh.rules = ml_collections.ConfigDict()
  c.lock()
  return c
