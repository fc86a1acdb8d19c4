r"""The transfer study: pretrain a causal and a masked LM, then adapt to TREC-6.

Command (one run does everything; started again it resumes):

  JAXTL_DATA_DIR=../shared/data jaxtl study \
    --config=transfer_study --workdir=/tmp/study

Writes transfer.md (test accuracy per backbone, init, scheme and number of
labeled examples), transfer.png (learning curves) and transfer.json.

Stages, on a 2-core CPU: two pretraining runs of ``pretrain_mixed``
(a GPT-style and a BERT-style model, 4 layers of width 128, on the mixed
offline corpus; the MLM run reuses the CLM run's tokenizer), then one
fine-tuning run per cell: {clm, mlm} x {pretrained, random} x {full,
features, scalar_mix, adapters, lora, ulmfit} x {100, 500, 1000, all 5,452}
x 3 seeds x a 2-point learning-rate grid. Each budget trains for at least
``min_steps`` updates (small sets get more epochs) and keeps the best epoch
on 545 held-out training questions; the learning rate is chosen on those
too, per init, and the table reports the mean and spread over seeds.

CPU time (2 cores): about 26 min (clm, 3,000 steps) and 52 min (mlm,
12,000 steps) of pretraining, then 30-90 s per fine-tuning run; the whole
default grid is 576 runs, about 8 hours. The full-fine-tuning half for one
backbone (48 runs) takes about an hour. The MLM gets 4x the CLM's steps
because each of its steps has 15% of the prediction targets: at 3,000 steps
it transferred +1.3 points at 500 labels, at 12,000 +10.9 (docs: studies/transfer-study).

A quicker look: ``--config.study.recipes='("full",)'``,
``--config.study.models='("clm",)'``, ``--config.study.seeds='(0,)'``,
``--config.study.num_labels='(500,)'``.
"""

import ml_collections

from jaxtl.configs import common, finetune, pretrain_mixed


def get_config(arg: str | None = None):
  del arg
  c = ml_collections.ConfigDict(dict(
      # Keyed by the names in study.models.
      pretrain=dict(clm=pretrain_mixed.get_config("objective=clm"),
                    mlm=pretrain_mixed.get_config("objective=mlm,steps=12000")),
      finetune=finetune.get_config("task=trec,scheme=full"),
      study=common.study_config()))
  c.finetune.task.max_len = 48  # TREC questions: at most ~40 tokens
  c.lock()
  return c
