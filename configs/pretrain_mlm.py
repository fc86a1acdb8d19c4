r"""Masked LM pretraining (BERT style) on IMDB reviews from local JSON lines.

Command:

  JAXTL_DATA_DIR=../shared/data \
  jaxtl pretrain --config=pretrain_mlm --workdir=/tmp/mlm

Data: $JAXTL_DATA_DIR/imdb/{unsup,train}.jsonl.gz (75,000 reviews) for
training, test.jsonl.gz for validation. A unigram sentencepiece vocabulary
(8k, with [MASK]/[CLS]/[SEP]) is trained on them first and cached in the
workdir. Masking: 15% of tokens, 80/10/10, a new mask every epoch.

Hardware / time: 2-core CPU, about 7 minutes (425 s at 6 steps/s; a minute
of it trains the tokenizer and tokenizes), measured 2026-11-21.
Expected: validation MLM loss 9.02 -> 6.18 nats (accuracy 12.1%) after 2000
steps, against a unigram entropy of 6.76 nats.

``:stages=bert`` trains as BERT did: 90% of the steps on rows a quarter as
long (32 tokens), the last 10% at the full 128, under one learning-rate
schedule (``config.stages``); evaluation stays at 128 tokens throughout.
``:stages=bert,steps=N`` sets the total (``--config.train.steps`` alone
would no longer match the stages). Measured 2026-11-22 with the 2 cores
shared: 7m24s (3m16s of it training, 30 steps/s in the first stage);
validation loss 9.02 -> 6.28 nats (accuracy 11.4%) after 2000 steps, having
read a third of the one-stage run's tokens.

``:objective=mlm_nsp`` adds BERT's next-sentence prediction, ``:objective=
mlm_sop`` ALBERT's sentence-order prediction: examples become ``[CLS] A
[SEP] B [SEP]`` pairs with token types, and a pooler + classifier on
[CLS] (``model.sentence_classes=2``) adds its loss to the MLM's; the logs
show ``sentence_loss`` and ``sentence_accuracy`` beside the MLM's.
"""

from jaxtl.configs import common

OBJECTIVES = ("mlm", "mlm_nsp", "mlm_sop")


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model="bert_tiny", stages="", steps=2000,
                          objective="mlm")
  if args.stages not in ("", "bert"):
    raise ValueError(f"config argument stages={args.stages!r}: expected bert "
                     "or nothing")
  if args.objective not in OBJECTIVES:
    raise ValueError(f"config argument objective={args.objective!r}: expected "
                     f"one of {', '.join(OBJECTIVES)}")
  c = common.pretrain_config(args.model)
  c.objective.name = args.objective
  if args.objective != "mlm":  # segments A/B and the sentence head
    c.model.update(type_vocab_size=max(c.model.type_vocab_size, 2), sentence_classes=2)
  imdb = lambda name: "{data_dir}/imdb/" + name
  c.data.source.update(kind="jsonl", field="text")
  c.data.source.files = dict(train=(imdb("unsup.jsonl.gz"), imdb("train.jsonl.gz")),
                             validation=(imdb("test.jsonl.gz"),))
  c.data.tokenizer.update(vocab_size=8000, model_type="unigram",
                          max_sentences=300_000)
  c.data.seq_len = 128
  c.data.batch_size = 32
  c.optim.update(lr=2e-3, warmup_steps=200)
  # A few minutes of pretraining underfits (each review is seen about once):
  # dropout would only slow it down.
  c.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)
  c.train.update(steps=args.steps, log_every=50, eval_every=500, eval_batches=20,
                 checkpoint_every=500)
  if args.stages == "bert":
    short = round(0.9 * args.steps)
    c.stages = (dict(steps=short, data=dict(seq_len=c.data.seq_len // 4)),
                dict(steps=args.steps - short))
  return c
