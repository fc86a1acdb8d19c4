r"""T5 span-corruption pretraining on WikiText-2 from local text files.

Command:

  JAXTL_DATA_DIR=../shared/data \
  jaxtl pretrain --config=pretrain_span --workdir=/tmp/span

Data: only WikiText-2's valid and test splits exist offline, so this recipe
trains on test.txt (245k words) and validates on valid.txt (217k words).
Tokenizer: a 4k unigram sentencepiece model with 100 sentinels, trained on
the train split and cached in the workdir (T5's own 32k C4 vocabulary works
too, ``--config.data.tokenizer.path={data_dir}/tokenizers/t5_c4_32k_100extra.spm.model``,
but its 32k-row vocabulary projection would be over half of t5_tiny's FLOPs).
Corruption: noise density 0.15, mean span 3; 128 input tokens come from 142
raw tokens, targets are at most 34 tokens.

Hardware / time: 2-core CPU, about 7-10 minutes (606 s at 1.8 steps/s, with
the test suite sharing the cores), measured 2026-11-21.
Expected: validation loss 8.32 -> 4.87 nats (accuracy 18.6%) after 800
steps, against a unigram entropy of 5.71 nats.
"""

from jaxtl.configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model="t5_tiny")
  c = common.pretrain_config(args.model)
  c.objective.name = "span"
  common.use_wikitext2(c)
  c.data.batch_size = 32
  c.optim.update(lr=2e-3, warmup_steps=100)
  c.train.update(steps=800, log_every=50, eval_every=200, eval_batches=0,
                 checkpoint_every=200)
  return c
