r"""Causal or masked LM pretraining on the whole offline English corpus.

This is the pretraining half of the transfer study (``transfer_study``):
a small model that has read enough text for its representations to help a
labeled task. Commands:

  JAXTL_DATA_DIR=../shared/data jaxtl pretrain \
    --config=pretrain_mixed:objective=clm --workdir=/tmp/mix_clm
  JAXTL_DATA_DIR=../shared/data jaxtl pretrain \
    --config=pretrain_mixed:objective=mlm --workdir=/tmp/mix_mlm

Data (about 25M words): IMDB unlabeled + train reviews, WikiText-2 test and
tiny Shakespeare for training; WikiText-2 valid for validation. One 8k
unigram sentencepiece vocabulary is trained on the mixture; pass
``--config.data.tokenizer.path`` to share one between the two runs.

Models: GPT-2 (clm) and BERT (mlm) layouts, both 4 layers of width 128
(``:model=PRESET`` takes a preset's size instead), pre-LN for both so one
learning rate suits them, no dropout (one pass over the data underfits). Sequences are 64
tokens: the downstream questions are short, and short rows make the step
cheap, so more text is read in the same CPU time.

Hardware / time (2-core CPU, measured 2026-11-21), alone on the machine:
clm about 2 steps/s, mlm about 3.9 (its vocabulary projection covers only
the masked 15%), so the default 3000 steps (12.3M tokens, half an epoch)
take about 26 and 13 min.
Expected after 3000 steps, WikiText-2 valid: clm 9.03 -> 4.13 nats/token
(unigram entropy 6.78); mlm 5.70 nats per masked token. The MLM is far
from converged there: ``:objective=mlm,steps=12000`` (52 min; what the
transfer study uses) reaches 3.54 nats per masked token (perplexity 34) and
transfers +10.9 points to TREC at 500 labels, against +1.3 after 3000.
"""

from jaxtl.configs import common, pretrain_electra

MODELS = {"clm": "gpt2_tiny", "mlm": "bert_tiny", "electra": "bert_tiny"}


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, objective="clm", model="", steps=3000)
  if args.objective not in MODELS:
    raise ValueError(f"objective {args.objective!r}: expected one of "
                     f"{sorted(MODELS)}")
  c = common.pretrain_config(args.model or MODELS[args.objective])
  c.objective.name = args.objective
  if args.objective == "electra":  # the discriminator: the MLM's architecture
    pretrain_electra.use_electra(c)
  c.data.source.kind = "mixture"
  # Concatenated; each rate is read once --config.data.source.mixing=rates
  # (shares of documents: Shakespeare is one document here, which an equal
  # rate would repeat 25,964 times; the run refuses such a mix).
  c.data.source.parts = dict(
      imdb=dict(kind="jsonl", field="text", rate=1.0, files=dict(train=(
          "{data_dir}/imdb/unsup.jsonl.gz", "{data_dir}/imdb/train.jsonl.gz"))),
      wikitext2=dict(kind="text", rate=1.0, files=dict(
          train=("{data_dir}/wikitext2/test.txt",),
          validation=("{data_dir}/wikitext2/valid.txt",))),
      shakespeare=dict(kind="text", paragraphs=True, rate=1.0, files=dict(
          train=("{data_dir}/tiny_shakespeare/input.txt",))))
  c.data.tokenizer.update(vocab_size=8000, model_type="unigram",
                          max_sentences=300_000)
  c.data.seq_len = 64
  c.data.batch_size = 64
  if not args.model:
    # 4 layers of width 128 (1.9M parameters, half of them the embedding):
    # about compute-optimal for 25 minutes of a 2-core CPU.
    c.model.update(num_layers=4, d_model=128, num_heads=2, head_dim=64,
                   mlp_dim=512, max_len=512)
  c.model.update(pre_norm=True, dropout_rate=0.0, attention_dropout_rate=0.0)
  c.optim.update(lr=2e-3, warmup_steps=200)
  c.train.update(steps=args.steps, log_every=100, eval_every=500,
                 eval_batches=20, checkpoint_every=500)
  return c
