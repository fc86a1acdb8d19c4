r"""MiniLM on TREC-6: jaxtl against the `transformers` (PyTorch) anchor, in one run.

  JAXTL_DATA_DIR=../shared/data python launch/minilm_trec.py --seeds=0,1,2 \
    --workdir=/tmp/minilm_trec
  # the same on 9,000 SST-2 sentences, one epoch:
  python launch/minilm_trec.py --task=sst2 --train_examples=9000 --epochs=1
  # a LoRA fine-tune against PEFT's (pip install peft accelerate):
  python launch/minilm_trec.py --scheme=lora --seeds=0

Both fine-tune all-MiniLM-L6-v2 on the same examples with the same recipe:
batch 32, AdamW lr 5e-5 and weight decay 0.01, 10% warmup then linear decay,
max length 64, 3 epochs, each batch drawn from texts of similar length
(``--nogroup_by_length``: plain shuffling) and padded only to its longest
text (jaxtl: rounded up to a few compiled lengths), computing in float32
(``--compute_dtype=bfloat16``: bfloat16 matmuls and activations, float32
parameters and optimizer state on both sides). jaxtl
runs ``configs/finetune_minilm.py``; PyTorch runs
``AutoModelForSequenceClassification`` ([CLS] + pooler, as `transformers`
users get it; on the GPU when there is one). By default both train on all 5452 TREC train questions and
the last epoch is scored on the 500 test questions, as in BERT's recipe;
``--dev_fraction=0.1`` instead holds out that share of train as dev and
scores the epoch with the best dev accuracy. Prints per seed and in summary:
test accuracy, training seconds per epoch (epoch 1 includes jaxtl's
compiles; the speed ratio uses the median of the later epochs) and the
ratio, and each side's whole run ("wall s": loading the data and model,
compiling, training, scoring and, for jaxtl, writing the workdir; the first
run in the process also starts its framework on the device; a second seed
finds jaxtl's steps in the persistent compilation cache). Writes
``summary.json`` in the workdir.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from absl import app, flags, logging

from jaxtl.runtime import startup

flags.DEFINE_string("workdir", "/tmp/minilm_trec", "Output folder.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (data order, dropout, head).")
flags.DEFINE_integer("epochs", 3, "Training epochs.")
flags.DEFINE_float("dev_fraction", 0.0,
                   "Share of train held out as dev to choose the epoch by; 0 "
                   "(the config's): train on all of train, report the last epoch.")
flags.DEFINE_bool("torch", True, "Also run the PyTorch anchor.")
flags.DEFINE_bool("group_by_length", True,
                  "Both sides draw each batch from texts of similar length (the "
                  "config's default); False: plain shuffling, as `transformers` "
                  "users get by default.")
flags.DEFINE_bool("pack", True,
                  "jaxtl packs each batch's examples into shared rows, attention "
                  "kept within each (config.train.pack, the config's default); "
                  "PyTorch keeps one example per row either way.")
flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"],
                  "What matmuls and activations compute in (jaxtl: "
                  "config.train.compute_dtype; PyTorch: bf16 autocast); parameters "
                  "and optimizer state stay float32.")
flags.DEFINE_string("task", "trec", "The built-in task (configs/finetune_minilm.py's "
                    "task=...: trec, sst2, cola, ...).")
flags.DEFINE_integer("train_examples", 0, "Train on a fixed random subset this big "
                     "(config.task.num_train_examples); 0: all (TREC: 5452).")
flags.DEFINE_integer("eval_examples", 0, "Score a fixed random subset of test (and "
                     "dev) this big (config.task.max_eval_examples): a quick look, "
                     "not comparable to full scores; 0: all.")
flags.DEFINE_bool("row_major_dots", False, "jaxtl's dense layers as row-major dots "
                  "with float32 accumulation (config.train.row_major_dots; "
                  "bfloat16 sets it by itself on CPUs where it pays).")
flags.DEFINE_string("init_from", "", "A Hugging Face BERT folder to fine-tune on both sides "
                    "instead of all-MiniLM-L6-v2 (config.init_from); empty: MiniLM.")
flags.DEFINE_string("pooling", "", "jaxtl's head: what it reads (config.task.pooling: "
                    "pooler is the anchor's [CLS] + pooler); empty: the config's.")
flags.DEFINE_enum("scheme", "full", ["full", "features", "lora"],
                  "What trains (the recipe's scheme=...): full; features, a probe "
                  "on the frozen backbone (PyTorch: the backbone's parameters "
                  "without gradients); lora (PyTorch: PEFT's LoRA with jaxtl's "
                  "rank, alpha and targets; needs `pip install peft accelerate`).")
FLAGS = flags.FLAGS


def _config(seed: int, epochs: int) -> Any:
  from jaxtl.configs import finetune_minilm  # pylint: disable=g-import-not-at-top
  c = finetune_minilm.get_config(f"task={FLAGS.task},scheme={FLAGS.scheme}")
  c.seed, c.train.epochs, c.train.checkpoint_every = seed, epochs, 0
  c.task.dev_fraction = FLAGS.dev_fraction
  c.task.num_train_examples = FLAGS.train_examples
  c.task.max_eval_examples = FLAGS.eval_examples
  c.train.group_by_length = FLAGS.group_by_length
  c.train.pack = FLAGS.pack
  c.train.compute_dtype = FLAGS.compute_dtype
  c.train.row_major_dots = FLAGS.row_major_dots
  c.task.pooling = FLAGS.pooling or c.task.pooling
  c.init_from = FLAGS.init_from or c.init_from
  return c


def run_jaxtl(seed: int, epochs: int, workdir: str) -> dict[str, Any]:
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  r = finetune.finetune_and_evaluate(_config(seed, epochs), workdir)
  return {"test": r["test"]["accuracy"],
          "seconds": [h["train_seconds"] for h in r["history"]],
          "dev": [h.get("accuracy") for h in r["history"]]}


def run_torch(seed: int, epochs: int) -> dict[str, Any]:
  """The anchor: a plain PyTorch loop over `transformers`' BERT classifier."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from jaxtl.data import batches as batches_lib  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top

  c = _config(seed, epochs)
  torch.manual_seed(seed)
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  splits = finetune.load_task_splits(c.task, seed)
  tok = transformers.AutoTokenizer.from_pretrained(c.init_from)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      c.init_from, num_labels=len(splits["train"].label_names)).to(device)
  # jaxtl's head, which these schemes train, holds the pooler and the classifier.
  if FLAGS.scheme == "features":
    for name, p in model.named_parameters():
      p.requires_grad = name.startswith(("bert.pooler.", "classifier."))
  elif FLAGS.scheme == "lora":
    import peft  # pylint: disable=g-import-not-at-top
    model = peft.get_peft_model(model, peft.LoraConfig(
        task_type="SEQ_CLS", r=c.adapt.lora_rank, lora_alpha=c.adapt.lora_alpha,
        target_modules=list(c.adapt.lora_targets), lora_dropout=c.adapt.lora_dropout,
        modules_to_save=["pooler"]))
  bs = c.train.batch_size
  steps = epochs * (len(splits["train"]) // bs)
  trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
  logging.info("PyTorch trains %d of %d parameters", sum(p.numel() for _, p in trained),
               sum(p.numel() for p in model.parameters()))
  decay = [p for n, p in trained if not any(k in n for k in ("bias", "LayerNorm"))]
  rest = [p for n, p in trained if any(k in n for k in ("bias", "LayerNorm"))]
  # Fused, as transformers' Trainer runs it by default (adamw_torch_fused).
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.optim.weight_decay},
                           {"params": rest, "weight_decay": 0.0}], lr=c.optim.lr,
                          fused=True)
  sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
  autocast = lambda: torch.autocast(device.type, torch.bfloat16,
                                    enabled=c.train.compute_dtype == "bfloat16")

  def batches(ex, order, drop_last=False):
    for i in range(0, len(order) - (len(order) % bs if drop_last else 0), bs):
      idx = order[i:i + bs]
      enc = tok([ex.texts[j] for j in idx], truncation=True, max_length=c.task.max_len,
                padding=True, return_tensors="pt").to(device)
      yield enc, torch.tensor([ex.labels[j] for j in idx], device=device)

  def accuracy(ex):
    model.eval()
    right = 0
    with torch.no_grad():
      for enc, labels in batches(ex, np.arange(len(ex))):
        with autocast():
          logits = model(**enc).logits
        right += int((logits.argmax(-1) == labels).sum())
    return right / len(ex)

  train_ex = splits["train"]
  lengths = np.array([len(ids) for ids in tok(list(train_ex.texts), truncation=True,
                                               max_length=c.task.max_len)["input_ids"]])
  rng = np.random.default_rng(seed)
  seconds, dev, test = [], [], []
  has_dev = splits["dev"] is not None
  for _ in range(epochs):
    model.train()
    start = time.perf_counter()
    order = (batches_lib.grouped_order(rng, lengths, bs) if c.train.group_by_length
             else rng.permutation(len(train_ex)))
    for enc, labels in batches(splits["train"], order, drop_last=True):  # as jaxtl
      with autocast():
        loss = model(**enc, labels=labels).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_([p for _, p in trained], c.optim.clip_norm)
      opt.step()
      sched.step()
      opt.zero_grad()
    if device.type == "cuda":
      torch.cuda.synchronize()
    seconds.append(round(time.perf_counter() - start, 2))
    dev.append(accuracy(splits["dev"]) if has_dev else None)
    test.append(accuracy(splits["test"]))
  chosen = int(np.argmax(dev)) if has_dev else -1  # else the last epoch
  return {"test": test[chosen], "seconds": seconds, "dev": dev,
          "test_by_epoch": test}


def _steady(seconds: list[float]) -> float:
  """An epoch's training time without compiles: the median after epoch 1."""
  return statistics.median(seconds[1:] or seconds)


def _mean_std(xs: list[float]) -> str:
  std = statistics.stdev(xs) if len(xs) > 1 else 0.0
  return f"{100 * statistics.mean(xs):.1f} ± {100 * std:.1f}"


def main(argv: list[str]) -> None:
  del argv
  os.makedirs(FLAGS.workdir, exist_ok=True)
  runs = {"jaxtl": [], "torch": []}
  for seed in map(int, FLAGS.seeds):
    workdir = os.path.join(FLAGS.workdir, f"jaxtl_seed{seed}")
    sides = {"jaxtl": lambda: run_jaxtl(seed, FLAGS.epochs, workdir)}
    if FLAGS.torch:
      sides["torch"] = lambda: run_torch(seed, FLAGS.epochs)
    for name, run in sides.items():
      start = time.perf_counter()
      r = run()
      r["wall"] = round(time.perf_counter() - start, 2)
      runs[name].append(r)
      print(f"seed {seed} {name}: test {r['test']:.3f}, dev by epoch {r['dev']}, "
            f"train seconds by epoch {r['seconds']}, wall {r['wall']} s", flush=True)
  print("| | test accuracy (mean ± std) | train s / epoch (epoch 1) | later epochs "
        "| wall s by seed |")
  print("|---|---:|---:|---:|---:|")
  for name, rs in runs.items():
    if rs:
      print(f"| {name} | {_mean_std([r['test'] for r in rs])} | "
            f"{statistics.mean(r['seconds'][0] for r in rs):.1f} | "
            f"{statistics.mean(_steady(r['seconds']) for r in rs):.1f} | "
            f"{', '.join(str(r['wall']) for r in rs)} |")
  if runs["torch"]:
    ratio = (statistics.mean(_steady(r["seconds"]) for r in runs["torch"])
             / statistics.mean(_steady(r["seconds"]) for r in runs["jaxtl"]))
    print(f"jaxtl epochs are {ratio:.2f}x as fast as PyTorch's")
    runs["speed_ratio"] = ratio
  with open(os.path.join(FLAGS.workdir, "summary.json"), "w") as f:
    json.dump(runs, f, indent=1)


if __name__ == "__main__":
  startup.tune_process()
  app.run(main)
