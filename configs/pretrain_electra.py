r"""ELECTRA pretraining (replaced-token detection) on the MLM recipe's data.

Command:

  JAXTL_DATA_DIR=../shared/data \
  jaxtl pretrain --config=pretrain_electra --workdir=/tmp/electra

Everything but the objective is ``pretrain_mlm.py``'s (IMDB reviews, an 8k
unigram vocabulary, bert_tiny, 2000 steps; its ``:stages=bert`` and
``:model=...`` too). The model config is the discriminator, which is what
a fine-tuning ``init_from`` of the workdir loads; a generator a quarter as
wide (``objective.generator_scale``, as deep: ``generator_layers=0``)
shares its token table. 15% of tokens are masked, 85% of them shown as
[MASK] and the rest kept (ELECTRA's recipe); the loss is the generator's
MLM plus ``objective.rtd_weight`` = 50 times the detection loss. Logged
``loss``/``accuracy`` are the generator's MLM numbers; ``rtd_loss``,
``rtd_accuracy`` and ``replaced`` (the fraction of real tokens the
generator's samples changed) the discriminator's.

Hardware / time: 2-core CPU; what was measured: docs, studies/electra-vs-mlm.
"""

from jaxtl.configs import pretrain_mlm


def use_electra(c):
  """ELECTRA's objective on a pretraining config: 15% masked, 85% of them
  shown as [MASK], the rest kept (no random tokens: the generator's samples
  are the replacements)."""
  c.objective.update(name="electra", mask_token_rate=0.85, random_token_rate=0.0)
  return c


def get_config(arg: str | None = None):
  return use_electra(pretrain_mlm.get_config(arg))
