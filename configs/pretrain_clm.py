r"""Causal LM pretraining (GPT-2 style) on tiny Shakespeare through TFDS.

Command (JAXTL_DATA_DIR set: TFDS prepares tiny_shakespeare offline from
$JAXTL_DATA_DIR/tiny_shakespeare; unset: TFDS downloads it, and without
network the run stops within seconds, saying so):

  jaxtl pretrain --config=pretrain_clm --workdir=/tmp/clm

Hardware / time: 2-core CPU, about 7 minutes (419 s at 1.1 steps/s, with the
test suite sharing the cores), measured 2026-11-21.
Expected: validation loss 7.69 -> 4.17 nats (accuracy 22.2%) after 400
steps, against a unigram entropy of 6.04 nats for the training tokens
(measured 2026-11-25; a tenth of the tokens are line breaks, easy ones).

Data: TFDS gives each split as one document, the whole text, which is cut
into rows with its line breaks and the blank lines between speeches, so
``jaxtl generate --checkpoint=/tmp/clm --prompt="ROMEO:"
--temperature=0.8`` writes a speech in lines. (``--config.data.packing=pack``
would keep only each split's first row: it truncates documents to a row.)

Variants: ``--config=pretrain_clm:model=gpt2_small`` (GPU).
"""

from jaxtl.configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model="gpt2_tiny")
  c = common.pretrain_config(args.model)
  c.objective.name = "clm"
  c.data.source.update(kind="tfds", name="tiny_shakespeare",
                       manual_dir=common.data_dir_path("tiny_shakespeare"))
  c.data.tokenizer.update(vocab_size=2048, model_type="bpe")
  c.data.seq_len = 128
  c.data.batch_size = 32
  c.optim.update(lr=1e-3, warmup_steps=100)
  c.train.update(steps=400, log_every=50, eval_every=100, eval_batches=0,
                 checkpoint_every=100)
  c.model.dropout_rate = 0.1
  return c
