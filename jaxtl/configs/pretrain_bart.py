r"""BART denoising pretraining on WikiText-2 from local text files.

Command:

  JAXTL_DATA_DIR=../shared/data \
  jaxtl pretrain --config=pretrain_bart --workdir=/tmp/bart

Data: as ``pretrain_span`` (trains on WikiText-2's test.txt, validates on
valid.txt; a 4k unigram sentencepiece model trained on the fly, whose
``[MASK]`` is BART's mask token).
Noise (Lewis et al. 2019, BART's best): every row's sentences (ended by
" . ", "?", "!" or EOS) shuffled, then spans of Poisson(3) lengths covering
30% of the tokens replaced by one ``[MASK]`` each (zero-length spans insert
one); the decoder writes the whole original row (128 tokens).

Hardware / time and the measured result: see README "Results on a 2-core CPU".
"""

from jaxtl.configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model="bart_tiny")
  c = common.pretrain_config(args.model)
  c.objective.update(name="bart", noise_density=0.3, mean_noise_span_length=3.0,
                     permute_sentence_ratio=1.0)
  wiki = lambda name: "{data_dir}/wikitext2/" + name
  c.data.source.update(kind="text")
  c.data.source.files = dict(train=[wiki("test.txt")],
                             validation=[wiki("valid.txt")])
  c.data.tokenizer.update(vocab_size=4000, model_type="unigram")
  c.data.seq_len = 128
  c.data.batch_size = 32
  c.optim.update(lr=1e-3, warmup_steps=100)
  c.train.update(steps=600, log_every=50, eval_every=200, eval_batches=0,
                 checkpoint_every=200)
  return c
