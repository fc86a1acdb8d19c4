"""Fine-tuning: adapt a pretrained (or random) backbone to a labeled task.

Transfer is configuration: ``config.init_from`` names a pretraining workdir
(its ``model_config.json``, tokenizer and newest checkpoint are used), a
fine-tuning workdir (its tuned backbone: intermediate-task transfer) or a
Hugging Face folder; the task head is new, and ``config.adapt`` picks the
scheme (full fine-tuning, frozen features + probe, scalar mix, adapters,
LoRA, ULMFiT schedules). Evaluates every epoch on the dev split, keeps the
best parameters by the task's first metric, scores them on the test split,
and writes ``results.json`` in the workdir. Before training it writes
``model_config.json``, ``tokenizer/`` and ``task.json``, so the workdir is a
complete model (``jaxtl.load``, ``jaxtl predict``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtl import layout, objectives, train
from jaxtl.data import tokenizer_files
from jaxtl.data import sources
from jaxtl.data.tokenizer_files import get_tokenizer
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig, attention, paths
from jaxtl.models.config import input_side, precision, with_row_major_dots
from jaxtl.models.heads import TaskModel
from jaxtl.tasks import config as tasks_config
from jaxtl.tasks import examples as examples_lib
from jaxtl.tasks import features as task_features
from jaxtl.tasks import file_task, inference, kinds, packing, train_plan
from jaxtl.tasks import readers as tasks
from jaxtl.tasks import spec as task_spec
from jaxtl.tasks.config import FinetuneConfig, TaskConfig, TaskSettings
from jaxtl.tasks.squad import SquadExamples, split_squad_by_article
from jaxtl.train import checkpoint
from jaxtl.train import identity as identity_lib
from jaxtl.train import optim, sharding
from jaxtl.pretraining import pretrain, pretrained
from jaxtl.train import workdir as workdir_lib

Array = jax.Array

# Parameters that each scheme trains; everything else is frozen.
SCHEMES: dict[str, tuple[str, ...]] = {
    "full": (),
    "features": (paths.under(paths.BACKBONE),),  # linear probe on frozen features
    "scalar_mix": (paths.under(paths.BACKBONE),),  # probe on a learned mix of all layers
    # adapters + norms + head
    "adapters": (paths.under(paths.BACKBONE, (paths.ADAPTER_RE, paths.NORM_RE)),),
    "lora": (paths.under(paths.BACKBONE, (paths.LORA_RE,)),),  # LoRA matrices + head
}


def make_task_loss_fn(model: TaskModel) -> Callable:
  """``loss_fn(params, batch, rng, normalizer=None) -> (loss, sums)`` for a head."""
  kind = kinds.get(model.kind)
  if kind.make_loss is not None:  # generation: the LM's own loss
    return kind.make_loss(model)
  side = input_side(model.config.family)
  loss_sums = kind.loss_sums

  def loss_fn(params, batch, rng, normalizer=None):
    out = model.apply(
        {"params": params}, batch[f"{side}_input_tokens"],
        batch[f"{side}_segment_ids"], batch[f"{side}_positions"],
        batch.get(f"{side}_token_type_ids"), deterministic=rng is None,
        packed=packing.spans(batch),
        rngs=None if rng is None else {"dropout": rng})
    sums = loss_sums(out, batch)
    return objectives.normalized_loss(sums, normalizer), sums

  return loss_fn


def task_summary(sums: Mapping[str, float], counts: str = "examples") -> dict[str, float]:
  """A head's training metrics: loss, accuracy and the loss weight, named
  for what it ``counts`` (examples, tags: not an LM's tokens), but no
  perplexity, which a class or tag distribution does not have."""
  out = objectives.summarize(sums)
  del out["perplexity"]
  out[counts] = out.pop("tokens")
  return out


def load_task_splits(task: TaskConfig, seed: int) -> dict[str, Any]:
  """train / dev / test Examples, of a built-in task or (``task=files``) of
  the user's files (:func:`jaxtl.tasks.file_task.load_splits`).

  Bad rows dropped with ``on_error=skip`` are logged (and counted in
  results.json, see :func:`data_report`); ``num_train_examples`` and
  ``max_eval_examples`` then cut the splits.
  """
  if task.name == tasks_config.FILES_TASK:
    splits = file_task.load_splits(task, seed)
  else:
    splits = _builtin_splits(task, seed)
  for name, ex in splits.items():
    if ex is not None and ex.skipped and (name != "test" or ex is not splits["dev"]):
      logging.warning("%s %s: skipped %d bad rows, the first: %s", task.name, name,
                      ex.skipped, ex.skipped_rows[0])
  train_ex, dev_ex, test_ex = splits["train"], splits["dev"], splits["test"]
  if task.num_train_examples:
    train_ex = examples_lib.sample(train_ex, task.num_train_examples, seed)
  if task.max_eval_examples:  # quick looks only: not comparable to full scores
    # One fixed sample for every seed, not the first N: a file sorted by
    # label (IMDB's) would give a one-class test set.
    dev_ex, test_ex = (None if ex is None
                       else examples_lib.sample(ex, task.max_eval_examples, 0)
                       for ex in (dev_ex, test_ex))
  return {"train": train_ex, "dev": dev_ex, "test": test_ex}


def splits_note(task: TaskConfig, splits: Mapping[str, Any]) -> str | None:
  """One line on a split the run goes without and how to add it, or None.

  Without dev there is no selection (the last epoch is the model); without
  test, dev is what is reported as the test score; without both, only the
  training loss is.
  """
  files = task.name == tasks_config.FILES_TASK
  add = {"dev": "--config.task.dev=FILE or --config.task.dev_fraction=0.1" if files
              else "--config.task.dev_fraction=0.1",
         "test": "--config.task.test=FILE or --config.task.test_fraction=0.1" if files
                 else "a task with a test split"}
  dev, test = splits["dev"], splits["test"]
  if dev is None and test is None:
    return ("no dev or test split: the last epoch is the model and only its "
            f"training loss is reported (add {add['dev']}; {add['test']})")
  if dev is None:
    return f"no dev split: the last epoch is the model (add {add['dev']})"
  if test is dev and files:
    return ("no test split: the dev split's scores are reported as the test's "
            f"(add {add['test']})")
  return None


def _builtin_splits(task: TaskConfig, seed: int) -> dict[str, Any]:
  """A built-in task's splits.

  Without a dev split (TREC, IMDB) ``task.dev_fraction`` of train is held
  out deterministically for model selection; ``dev_fraction=0`` trains on
  all of train and "dev" is None: no selection, the last epoch is the model
  (the final run once a recipe was chosen on a held-out dev). Without public
  test labels (GLUE) the dev split is also what is reported. SQuAD (only its
  dev file is offline) trains on one article half, holds articles of it out
  as dev and reports the other half.
  """
  names = tasks.TASK_SPLITS[task.name]
  load = lambda split: tasks.load_task(task.name, split, on_error=task.on_error)
  train_ex = load("train")
  dev_ex = None
  if "dev" in names and task.name != "squad":  # SQuAD's "dev" is the whole file
    dev_ex = load("dev")
  elif task.dev_fraction:
    train_ex, dev_ex = _hold_out(train_ex, task.dev_fraction, seed)
  test_split = next((s for s in ("test", "eval") if s in names), None)
  test_ex = load(test_split) if test_split else dev_ex
  return {"train": train_ex, "dev": dev_ex, "test": test_ex}


MAX_LISTED_ROWS = 1000  # skipped rows results.json names, per split


def data_report(splits: Mapping[str, Any], feats: Mapping[str, Any]
                ) -> dict[str, dict[str, Any]]:
  """Per split: examples used, bad rows skipped (counted, and the first
  ``MAX_LISTED_ROWS`` as "file:line: reason"), inputs cut to max_len;
  results.json keeps it, so lost data is on record, not only in a log."""
  return {name: {"examples": len(ex), "skipped_rows": getattr(ex, "skipped", 0),
                 "skipped": list(getattr(ex, "skipped_rows", []))[:MAX_LISTED_ROWS],
                 "truncated": int(feats[name].truncated)}
          for name, ex in splits.items() if ex is not None}


def _hold_out(ex: Any, fraction: float, seed: int) -> tuple[Any, Any]:
  """(train, dev): a random share of examples, or of articles for SQuAD."""
  if isinstance(ex, SquadExamples):  # questions on one passage stay together
    train, dev = split_squad_by_article(ex.examples, fraction, seed)
    return (dataclasses.replace(ex, examples=train),
            dataclasses.replace(ex, examples=dev, skipped_rows=[]))
  return ex.split_off(fraction, seed)


def score(task: TaskConfig, preds: np.ndarray, feats: task_features.Features,
          examples: Any) -> dict[str, float]:
  """The task's metrics of ``preds`` (see :mod:`jaxtl.tasks.kinds`)."""
  return kinds.get(task.kind).score(task, preds, feats, examples)


def model_outputs(model: TaskModel, task: TaskSettings, tok: Tokenizer) -> Callable:
  """``(params, batch) -> output``: the model's apply on its input side, or
  what the task kind computes instead (generation: the decoded ids).
  ``task``: the run's, or a loaded model's spec."""
  kind = kinds.get(model.kind)
  if kind.forward is not None:
    return kind.forward(model, task, tok)
  side = input_side(model.config.family)
  return lambda p, b: model.apply(
      {"params": p}, b[f"{side}_input_tokens"], b[f"{side}_segment_ids"],
      b[f"{side}_positions"], b.get(f"{side}_token_type_ids"), packed=packing.spans(b))


def _predictions(outputs: Callable, task: TaskConfig, params: Any, batch: Any) -> Array:
  """Scores (regression), class or tag ids, or span (start, end, score) rows."""
  return kinds.get(task.kind).predict(outputs(params, batch), batch, task)


def _precision(train: tasks_config.FinetuneTrainConfig) -> tuple[str, bool]:
  """(compute dtype, "" for the backbone's; row-major dots) for this run:
  ``auto`` decided as a recipe's model.dtype is
  (:func:`jaxtl.models.config.precision`)."""
  if not train.compute_dtype:
    return "", train.row_major_dots
  picked = precision({"dtype": train.compute_dtype, "row_major_dots": train.row_major_dots},
                     "--config.train.compute_dtype=float32")
  return picked["dtype"], picked["row_major_dots"]


def _backbone(config: FinetuneConfig
              ) -> tuple[TransformerConfig, Tokenizer, Any, tuple[str, ...]]:
  """(model config, tokenizer, pretrained params or None, what of the
  checkpoint is left out: an earlier task's head) per config.init_from."""
  adapt, dtype = config.adapt, config.train.compute_dtype
  if dtype not in tasks_config.COMPUTE_DTYPES:  # before a model is read
    raise ValueError(f"config.train.compute_dtype={dtype!r}; expected one of "
                     f"{', '.join(filter(None, tasks_config.COMPUTE_DTYPES))} or \"\" "
                     "(the backbone's)")
  dtype, row_major = _precision(config.train)
  dropped = ()
  if config.init_from:
    loaded = pretrained.load(config.init_from, config.tokenizer_path)
    cfg, tok, dropped = loaded.config, loaded.tokenizer, loaded.dropped
    logging.info("backbone from %s: %s, %d layers, d_model %d, vocab %d (config.model "
                 "is not used: it shapes a random start only)", config.init_from,
                 cfg.family, cfg.num_layers, cfg.d_model, cfg.vocab_size)
    params = {paths.BACKBONE: loaded.params, paths.HEAD: loaded.head}
    if cfg.adapter_dim and (adapt.scheme != "adapters"
                            or adapt.adapter_dim != cfg.adapter_dim):
      logging.warning("%s was tuned with adapters (dim %d), which cannot be merged "
                      "into the backbone: this run (scheme %s) starts without them",
                      config.init_from, cfg.adapter_dim, adapt.scheme)
  else:
    if not config.tokenizer_path:
      raise ValueError("config.init_from is empty: set --config.init_from=MODEL (a "
                       "jaxtl workdir or a Hugging Face folder), or for a random "
                       "start --config.tokenizer_path=VOCAB")
    tok = get_tokenizer(sources.expand_path(config.tokenizer_path))
    model = {**config.model, **({"dtype": dtype} if dtype else {})}  # decided once
    cfg, params = pretrain.model_config_from(model, tok.vocab_size,
                                             config.vocab_multiple), None
  if not dtype:  # the backbone's precision, with its row-major dots
    row_major = with_row_major_dots(cfg.dtype, row_major or cfg.row_major_dots)
  cfg = cfg.replace(dtype=dtype or cfg.dtype, row_major_dots=row_major,
                    dropout_rate=adapt.dropout_rate, attention_dropout_rate=adapt.attention_dropout_rate,
                    adapter_dim=adapt.adapter_dim if adapt.scheme == "adapters" else 0,
                    lora_rank=adapt.lora_rank if adapt.scheme == "lora" else 0,
                    lora_alpha=adapt.lora_alpha, lora_dropout=adapt.lora_dropout,
                    lora_targets=tuple(adapt.lora_targets))
  return cfg, tok, params, dropped


def check_loadable(workdir: str, tok: Tokenizer, spec: task_spec.TaskSpec) -> bool:
  """Refuses (:class:`jaxtl.train.workdir.WorkdirConflict`) a run whose
  task or tokenizer differs from those a workdir's checkpoints were trained
  with: the labels read from this run's data, the head, the vocabulary.
  Returns whether the workdir's task and tokenizer are bound to checkpoints
  already. Reads only; the architecture is checked as it is written
  (:func:`jaxtl.pretraining.pretrained.save_model_config`)."""
  if not (workdir_lib.holds_checkpoints(workdir) and task_spec.exists(workdir)):
    return False
  changed = task_spec.differences(task_spec.load(workdir), spec)
  try:
    if tokenizer_files.workdir_tokenizer(workdir).fingerprint() != tok.fingerprint():
      changed.append(f"tokenizer: {layout.tokenizer_dir(workdir)} -> "
                     "another vocabulary")
  except FileNotFoundError:
    pass
  if changed:
    raise workdir_lib.WorkdirConflict(
        f"{workdir} holds checkpoints of another task, and nothing in it was "
        f"changed: {'; '.join(changed)} ({layout.TASK_FILE} records the first). "
        "Pass another --workdir for this run, or rerun with the data and settings "
        "it was trained with.")
  return True


def keep_loadable(workdir: str, cfg: TransformerConfig, tok: Tokenizer,
                  spec: task_spec.TaskSpec, bound: bool = False) -> None:
  """Writes what reloads the fine-tuned model beside its checkpoints: the
  backbone's architecture, the tokenizer and the task. Done before training,
  so even a stopped run is loadable (``jaxtl.load``, ``init_from``) once it
  has a checkpoint. ``bound`` (:func:`check_loadable`: the workdir's task
  and tokenizer describe its checkpoints already): they stay as they are."""
  pretrained.save_model_config(cfg, workdir)
  if not bound:
    tokenizer_files.keep_tokenizer(tok, workdir)
    task_spec.save(spec, workdir)


# What a fine-tuning workdir's checkpoints are bound to (jaxtl.train.identity),
# besides the backbone; the labels read from the data are checked against
# task.json as well (check_loadable).
IDENTITY_KEYS = ("init_from", "tokenizer_path", "task.name", "task.kind", "task.labels",
                 "task.label_words", "task.pooling", "task.text_fields",
                 "task.label_field", "adapt.scheme")
_SCHEME_KEYS = {"adapters": ("adapt.adapter_dim",),
                "lora": ("adapt.lora_rank", "adapt.lora_targets")}


def identity(config: FinetuneConfig) -> dict[str, Any]:
  """The settings a fine-tuning workdir's checkpoints are bound to: the
  backbone (``init_from``, or ``config.model`` without it), the task and
  its head, the scheme and what shapes its parameters."""
  keys = [*IDENTITY_KEYS, *_SCHEME_KEYS.get(config.adapt.scheme, ())]
  if not config.init_from:
    keys += ["model"]
  return identity_lib.pick(config, keys,
                           skip=[f"model.{k}" for k in pretrained.RUNTIME_FIELDS])


def loop_config(config: FinetuneConfig, steps_per_epoch: int, batch_devices: int = 1
                ) -> train.LoopConfig:
  """The loop's numbers from a fine-tuning config: epochs become steps;
  ``batch_devices``: the devices the mesh splits each batch over."""
  t = config.train
  if t.epochs <= 0 or t.checkpoint_every < 0:
    bad = ("epochs", t.epochs, "more than 0") if t.epochs <= 0 else (
        "checkpoint_every", t.checkpoint_every, "0 (only best/ and on SIGTERM) or more epochs")
    raise train.ConfigError(f"config.train.{bad[0]}={bad[1]!r}: must be {bad[2]}")
  # Fractions of an epoch round to whole steps, but never to 0 (no checkpoints).
  every = max(1, round(t.checkpoint_every * steps_per_epoch)) if t.checkpoint_every else 0
  return train.LoopConfig(
      steps=t.epochs * steps_per_epoch, batch_size=t.batch_size, log_every=t.log_every,
      eval_every=steps_per_epoch, checkpoint_every=every,
      save_last=True, keep_checkpoints=1,  # a rerun of a finished run only evaluates
      max_bad_steps=t.max_bad_steps, accum_steps=config.optim.accum_steps,
      seed=config.seed, batch_devices=batch_devices,
  ).check({"steps": "train.epochs", "accum_steps": "optim.accum_steps"})


def finetune_and_evaluate(config: FinetuneConfig | Mapping[str, Any], workdir: str,
                          on_start: Callable[[], None] = lambda: None) -> dict[str, Any]:
  """Fine-tunes per config in the one training loop; returns (and writes)
  the results dict. ``on_start`` runs once the run's checks passed, before
  it writes anything to ``workdir`` (``jaxtl pretrain`` records the
  config and the workdir's identity there).

  ``config`` is typed, or a recipe's ConfigDict as a user holds it in
  Python (the command line's), typed here once
  (:func:`jaxtl.tasks.config.of`): the boundary where it is read.
  """
  config = tasks_config.of(config)
  os.makedirs(workdir, exist_ok=True)
  task, adapt = config.task, config.adapt
  if adapt.scheme not in SCHEMES:
    raise ValueError(f"config.adapt.scheme={adapt.scheme!r}; known: {sorted(SCHEMES)}")
  cfg, tok, init_params, dropped = _backbone(config)
  pretrain.check_positions(  # before the data is read
      cfg, {"inputs": task.max_len}, f"config.task.max_len={task.max_len}",
      f"the max_len of config.init_from={config.init_from}" if config.init_from
      else "config.model.max_len")
  splits = load_task_splits(task, config.seed)
  if (note := splits_note(task, splits)) is not None:
    logging.info("%s", note)
  kind = kinds.get(task.kind)
  feats = {k: kind.encode(v, tok, task, cfg) for k, v in splits.items()
           if v is not None}
  for name, f in feats.items():
    if f.truncated:
      logging.info("%s: %d of %d examples longer than %d tokens (%s)", name,
                   f.truncated, len(splits[name]), task.max_len, kind.too_long)
  spec = task_spec.from_config(config, cfg.family,
                               getattr(splits["train"], "label_names", None),
                               getattr(splits["train"], "text_pairs", None) is not None)
  model = task_spec.task_model(cfg, spec, tok)
  bs, multiple = config.train.batch_size, config.train.length_multiple
  steps_per_epoch = len(feats["train"]) // bs
  if not steps_per_epoch:
    raise ValueError(f"{task.name}: {len(feats['train'])} training examples, fewer "
                     f"than one batch (config.train.batch_size={bs})")
  mesh = sharding.make_mesh(config.mesh.shape)
  rules = sharding.make_rules(config.mesh.rules)
  # The loop's numbers checked before anything is written or built.
  numbers = loop_config(config, steps_per_epoch, sharding.batch_devices(mesh))
  bound = jax.process_index() == 0 and check_loadable(workdir, tok, spec)
  on_start()
  if jax.process_index() == 0:
    keep_loadable(workdir, cfg, tok, spec, bound)
  side = input_side(cfg.family)
  init_inputs = {"tokens_BT": feats["train"].arrays[f"{side}_input_tokens"][:1]}
  abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                     **init_inputs))["params"]
  freeze = SCHEMES[adapt.scheme] + tuple(adapt.freeze)
  tx, schedule = optim.make_finetune_optimizer(
      config.optim, numbers.steps, abstract, cfg.num_layers, freeze=freeze,
      layer_decay=adapt.layer_decay,
      unfreeze_every=int(round(adapt.unfreeze_epochs * steps_per_epoch)))
  trainable, n_params = optim.count_trainable(abstract, freeze)
  logging.info("trainable parameters: %d of %d (%.2f%%)", trainable, n_params,
               100 * trainable / n_params)
  if (cost := attention.attention_dropout_cost(cfg)) is not None:
    logging.warning(cost)
  load_pretrained, report = pretrained.params_loader(abstract, init_params,
                                                     config.init_from, dropped)

  eval_fn = jax.jit(functools.partial(_predictions, model_outputs(model, task, tok),
                                      task))

  def scores(params, split):
    preds = inference.predict(eval_fn, params, feats[split].arrays, bs, mesh, side, multiple,
                    desc=split, interruptible=split == "test",
                    pack=config.train.pack and kind.packs)
    return score(task, preds, feats[split], splits[split])

  def test_scores(state):  # of the selected state
    if "dev" not in feats:  # the last epoch's: the state in hand (best/ holds the same)
      return scores(state.params, "test")
    if splits["test"] is splits["dev"]:  # scored already, when dev chose the state
      chosen = checkpoint.saved_extra(layout.best(workdir)).get("dev")
      if chosen is not None:
        logging.info("the test split is the dev split: its scores are the selected "
                     "epoch's dev scores")
        return chosen
    best = checkpoint.load_params(layout.best(workdir))
    return scores(jax.device_put(best, jax.tree.map(lambda x: x.sharding, state.params)),
                  "test")

  train_batches, cut = train_plan.train_batches(feats["train"].arrays, config, side,
                                                 cfg.dtype, sharding.batch_devices(mesh))
  work = train.Workload(
      model=model, loss_fn=optim.frozen_without_gradients(make_task_loss_fn(model),
                                                          abstract, freeze),
      weight_fn=lambda b: jnp.sum(b[kind.weights]), init_inputs=init_inputs,
      batches=train_batches,
      # No dev split: nothing to select on, the last epoch is the model.
      evaluate=functools.partial(scores, split="dev") if "dev" in feats else None,
      eval_name="dev", select=lambda dev: next(iter(dev.values())),
      prepare=cut,
      whole_batches=True,  # every process cuts the same length
      init_params=load_pretrained, steps_per_epoch=steps_per_epoch,
      finish=test_scores if "test" in feats else None,
      # A head's metrics; generation's are an LM's (perplexity included).
      summarize=(objectives.summarize if kind.make_loss is not None
                 else functools.partial(task_summary, counts=kind.counts)))
  out = train.run(work, numbers, tx, schedule, mesh, rules, workdir)
  history = [{"epoch": h.pop("step") // steps_per_epoch, **h} for h in out.history]
  test = out.final
  results = {"task": task.name, "scheme": adapt.scheme, "init_from": config.init_from,
             "train_examples": len(feats["train"]), "epochs": config.train.epochs,
             "trainable_params": trainable, "total_params": n_params,
             "best_dev": out.best, "test": test, "history": history,
             "discarded": report.get("discarded", []), "new": report.get("new", []),
             "data": data_report(splits, feats)}
  with open(layout.results_file(workdir), "w") as f:
    json.dump(results, f, indent=1)
  return results
