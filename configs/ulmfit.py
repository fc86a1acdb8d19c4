r"""ULMFiT as published (Howard & Ruder 2018): its stages 2 and 3, after the
general-domain causal LM of ``pretrain_clm`` (stage 1).

Commands (JAXTL_DATA_DIR set), one per stage:

  jaxtl pretrain --config=pretrain_clm --workdir=workdirs/clm
  jaxtl pretrain --config=ulmfit:stage=lm,task=trec \
    --config.init_from=workdirs/clm --workdir=workdirs/clm_trec
  jaxtl finetune --config=ulmfit:stage=classifier,task=trec \
    --config.init_from=workdirs/clm_trec --workdir=workdirs/trec_ulmfit

``stage=lm`` (target-domain LM fine-tuning) is continued causal LM
pretraining (``init_from``: the general model, its tokenizer kept) on the
task's own texts, without their labels: TREC's training questions (the test
questions only score the LM), or IMDB's unlabeled + training reviews (the
test reviews score it). Slanted triangular learning rates: the rate climbs
from lr/32 to lr over the first 10% of the steps, then falls back to lr/32
(``optim.schedule=stlr``, ``jaxtl.train.optim.make_schedule``).

``stage=classifier`` fine-tunes the whole model on the labels with the
paper's four devices: concat pooling (the head reads [last token, max,
mean] of the last layer, ``task.pooling=concat``); discriminative rates,
each layer at 1/2.6 of the rate of the one above (``adapt.layer_decay``);
gradual unfreezing, the top group (head + final norm) in the first epoch and
one more layer each epoch after (``adapt.unfreeze_epochs=1``), over
num_layers + 2 epochs so the embeddings train in the last one; and STLR.
Adam with the paper's beta1=0.7, beta2=0.99.

Left out from the paper: AWD-LSTM (this is a Transformer), discriminative
rates in the LM stage (pretraining has one rate for all layers), BPTT for
text classification, and the forward + backward ensemble.

``:model=`` names the preset of stage 1 (the classifier's epoch count
follows its depth).

Hardware / time (gpt2_tiny, TREC, 2-core CPU shared with a test run,
2026-11-22): stage 1 577 s, stage 2 154 s (TREC test-question loss 6.53 ->
3.29 nats), stage 3 261 s. Expected: TREC-6 test accuracy 83.8% (macro-F1
84.1), one seed; 81.4% without stage 2. docs: studies/ulmfit
compares it with milder classifier settings (86.0% from the same stage 2).
"""

from typing import Any

from jaxtl.configs import common, finetune, models, pretrain_clm

# The task's texts as a pretraining corpus: train for the LM, eval to score it.
TARGET_TEXTS: dict[str, dict[str, Any]] = {
    # TREC lines are "COARSE:fine question", Latin-1: keep the question.
    "trec": dict(kind="text", encoding="latin-1", line_pattern=r"^\S+ (.*)$",
                 files=dict(train=("{data_dir}/trec/train_5500.label",),
                            validation=("{data_dir}/trec/TREC_10.label",))),
    "imdb": dict(kind="jsonl", field="text",
                 files=dict(train=("{data_dir}/imdb/unsup.jsonl.gz",
                                   "{data_dir}/imdb/train.jsonl.gz"),
                            validation=("{data_dir}/imdb/test.jsonl.gz",))),
}

# The paper's numbers (section 3.2 and 3.3; Adam betas from section 4).
CUT_FRAC, RATIO, LAYER_FACTOR = 0.1, 32.0, 2.6


def _stlr(optim: common.ConfigDict, lr: float) -> None:
  """Slanted triangular rates peaking at ``lr``, and the paper's Adam."""
  optim.update(lr=lr, schedule="stlr", warmup_steps=0, warmup_fraction=CUT_FRAC,
               end_lr_ratio=1 / RATIO, b1=0.7, b2=0.99)


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, stage="lm", task="trec", model="gpt2_tiny",
                          steps=200)
  if args.stage == "lm":
    if args.task not in TARGET_TEXTS:
      raise ValueError(f"config argument task={args.task!r}: stage=lm reads the "
                       f"task's texts, known for {sorted(TARGET_TEXTS)}")
    c = pretrain_clm.get_config(f"model={args.model}")
    c.data.source = common.source_config(**TARGET_TEXTS[args.task])
    # TREC's 5,452 questions are 894 rows of 128 tokens (gpt2_tiny's 2k BPE),
    # 28 batches of 32: 200 steps read them about 7 times.
    c.train.update(steps=args.steps, eval_every=50, checkpoint_every=100)
    _stlr(c.optim, 1e-3)
    return c
  if args.stage == "classifier":
    c = finetune.get_config(f"task={args.task},scheme=full,model={args.model}")
    c.task.pooling = "concat"
    c.adapt.update(layer_decay=1 / LAYER_FACTOR, unfreeze_epochs=1.0)
    # Depth groups: embeddings, each layer, the top (head): all train in the last.
    c.train.epochs = models.PRESETS[args.model]["num_layers"] + 2
    _stlr(c.optim, 1e-3)
    return c
  raise ValueError(f"config argument stage={args.stage!r}: expected lm or classifier")
