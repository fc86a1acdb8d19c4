"""Pretraining: a corpus and an objective, handed to the one training loop.

From random weights, or continued from a pretrained model
(``config.init_from``: domain-adaptive pretraining, e.g. MiniLM's MLM on
movie reviews), whose architecture, tokenizer and weights it then takes.
In ``config.stages`` (BERT: 90% of the steps at length 128, the rest at
512), one optimizer and schedule over all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import types
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import ml_collections

from jaxtl import objectives
from jaxtl.data import sources
from jaxtl.pretraining import pipeline
from jaxtl.models import TransformerConfig, attention, electra, paths
from jaxtl.models import config as model_config
from jaxtl.train import identity as identity_lib
from jaxtl.train import loop, optim, perf, sharding, workload
from jaxtl.pretraining import pretrained
from jaxtl.pretraining import config as pretrain_config
from jaxtl.pretraining.config import PretrainConfig, Stage
from jaxtl.train import step as step_lib


def model_config_from(model: Mapping[str, Any], vocab_size: int,
                      vocab_multiple: int = 128) -> TransformerConfig:
  """A config's ``model`` section -> TransformerConfig; its vocab_size 0
  means "the tokenizer's", padded up to ``vocab_multiple``, and its dtype
  ``auto`` (the recipes' default) what
  :func:`jaxtl.models.config.precision` picks here."""
  values = dict(model)
  if not values.get("vocab_size"):
    values["vocab_size"] = -(-vocab_size // vocab_multiple) * vocab_multiple
  elif values["vocab_size"] < vocab_size:
    raise ValueError(f"config.model.vocab_size={values['vocab_size']} is smaller "
                     f"than the tokenizer's {vocab_size} ids")
  return TransformerConfig.from_mapping(values)


def load_source(config: PretrainConfig) -> pretrained.Pretrained | None:
  """The model ``config.init_from`` names (None: a random start), after
  checking the objective fits it (or config.model)."""
  model_config.check_dtype(config.model)  # before a tokenizer is trained
  if not config.init_from:
    objectives.check_objective(config.objective.name, config.model["family"])
    objectives.check_model(config.objective.name, types.SimpleNamespace(**config.model))
    return None
  # A tokenizer path still overrides, as in fine-tuning (same ids, other files).
  source = pretrained.load(config.init_from, config.data.tokenizer.path)
  objectives.check_objective(config.objective.name, source.config.family,
                             f"the model of init_from={config.init_from}")
  objectives.check_model(config.objective.name, source.config,
                         f"(the model of init_from={config.init_from})")
  return source


def architecture(config: PretrainConfig, source: pretrained.Pretrained | None,
                 vocab_size: int) -> TransformerConfig:
  """config.model's, or the source's with config.model's dropout rates and
  dtype."""
  if source is None:
    return model_config_from(config.model, vocab_size, config.vocab_multiple)
  cfg = source.config
  if cfg.vocab_size < vocab_size:
    raise ValueError(f"init_from={config.init_from} has {cfg.vocab_size} token "
                     f"embeddings, fewer than the tokenizer's {vocab_size} ids")
  logging.info("continued pretraining from %s: its architecture (%s, %d layers, "
               "d_model %d, vocab %d) and tokenizer; config.model sets only the "
               "dropout rates and dtype", config.init_from, cfg.family, cfg.num_layers,
               cfg.d_model, cfg.vocab_size)
  return cfg.replace(dropout_rate=config.model["dropout_rate"],
                     attention_dropout_rate=config.model["attention_dropout_rate"],
                     **model_config.precision(config.model))


def source_loader(params_shape: Any, source: pretrained.Pretrained | None,
                  init_from: str) -> Callable[[], dict[str, Any]] | None:
  """Loads the source's weights, LM head included, into a fresh state;
  shapes are checked now, before training."""
  if source is None:
    return None
  load, report = pretrained.params_loader(params_shape, source.params, init_from)
  in_head = lambda names: [n for n in names if n.startswith(paths.LM_HEAD + "/")]
  head_loaded, head_new = in_head(report["loaded"]), in_head(report["new"])
  head = (f"{len(head_loaded)} tensors loaded" if head_loaded
          else "newly initialised (the source has none)" if head_new
          else "the token table (tied)")

  def load_and_say() -> dict[str, Any]:  # said only when it happens: a resumed
    logging.info("LM head: %s", head)     # run restores its own head instead
    return load()
  return load_and_say


def _generator(model: Any) -> TransformerConfig | None:
  """ELECTRA's generator architecture (None for other objectives' models)."""
  return model.generator_config if isinstance(model, electra.ElectraPretrainer) else None


def check_positions(model_cfg: TransformerConfig, lengths: Mapping[str, int],
                    where: str, table: str = "config.model.max_len") -> None:
  """A learned position table must cover every length the run feeds it
  (past its end every position would share the last embedding, silently).
  ``where`` is the key that sets the length, ``table`` what sets the model's
  positions."""
  longest = max(lengths.values())
  if model_cfg.position == "learned" and longest > model_cfg.max_len:
    raise workload.ConfigError(f"{where}: batches of {longest} tokens need {longest} "
                           f"positions, but the model has {model_cfg.max_len} ({table})")


def make_stage(index: int, stage: Stage, init_from: str, data: pipeline.DataSetup,
               model_cfg: TransformerConfig, model: nn.Module, params_shape: Any,
               where: str, run_objective: objectives.Objective) -> workload.Stage:
  """A stage's batches (a stream of their own after the first, so a stage
  over the same rows does not repeat its predecessor's), loss and numbers."""
  objective = objectives.get(stage.objective.name)
  try:
    objectives.check_objective(objective.name, model_cfg.family)
    objectives.check_model(objective.name, model_cfg,
                           f"(the model of init_from={init_from})"
                           if init_from else "config.model")
    check_same_model(objective, run_objective)
    batches, prepared = data.stage_batches(stage.data, stage.objective,
                                           stream=(index,) if index else ())
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e
  check_positions(model_cfg, prepared.lengths, f"{where}.data.seq_len")
  loss_fn = objective.make_loss_fn(model, prepared.max_predictions, stage.objective)
  flops = perf.flops_per_example(model_cfg, params_shape, *prepared.lengths.values(),
                                 head_positions=prepared.max_predictions,
                                 generator=_generator(model))
  return workload.Stage(
      steps=stage.steps, batches=batches, loss_fn=loss_fn,
      batch_size=stage.data.batch_size, flops_per_example=flops,
      tokens_per_example=sum(prepared.lengths.values()),
      info={f"{side}_length": n for side, n in prepared.lengths.items()})


def check_same_model(objective: objectives.Objective, run: objectives.Objective) -> None:
  """A stage's objective must train the run's module (ELECTRA's pretrainer
  is not an MLM's encoder) and normalise its loss the same way."""
  if (objective.build_model is not run.build_model
      or objective.weight_total is not run.weight_total):
    raise ValueError(f"objective {objective.name!r} trains another model than the "
                     f"run's {run.name!r} (config.objective.name); stages may change "
                     "the objective only between those that train the same model")


def identity(config: PretrainConfig) -> dict[str, Any]:
  """The settings a pretraining workdir's checkpoints are bound to
  (:mod:`jaxtl.train.identity`): what it starts from, its objective and
  tokenizer, and (from scratch) its architecture, without what may change
  on a resume (dropout, dtype, remat)."""
  keys = ["init_from", "objective.name", "data.tokenizer.path",
          "data.tokenizer.vocab_size", "data.tokenizer.model_type"]
  if not config.init_from:
    keys += ["model", "vocab_multiple"]
  return identity_lib.pick(config, keys,
                           skip=[f"model.{k}" for k in pretrained.RUNTIME_FIELDS])


def loop_config(config: PretrainConfig, batch_devices: int = 1) -> workload.LoopConfig:
  """The loop's numbers from a pretraining config (all in steps);
  ``batch_devices``: the devices the mesh splits each batch over."""
  t = config.train
  numbers = workload.LoopConfig(
      steps=t.steps, batch_size=config.data.batch_size, log_every=t.log_every,
      eval_every=t.eval_every, eval_at_start=True,
      checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints,
      max_bad_steps=t.max_bad_steps, accum_steps=config.optim.accum_steps,
      prefetch=config.data.prefetch, peak_flops=t.peak_flops, seed=config.seed,
      batch_devices=batch_devices,
  ).check({"batch_size": "data.batch_size", "accum_steps": "optim.accum_steps"})
  for k, stage in enumerate(config.stages):  # each stage's batches meet the same rules
    dataclasses.replace(numbers, steps=stage.steps, batch_size=stage.data.batch_size).check(
        {"steps": f"stages[{k}].steps", "batch_size": f"stages[{k}].data.batch_size",
         "accum_steps": "optim.accum_steps"})
  return numbers


def train_and_evaluate(config: PretrainConfig | ml_collections.ConfigDict, workdir: str,
                       on_start: Callable[[], None] = lambda: None) -> dict[str, float]:
  """Pretrains per ``config`` into ``workdir``; returns the final eval metrics.

  ``config`` is typed, or a recipe's ConfigDict as a user holds it in
  Python, typed here once (:func:`jaxtl.pretraining.config.of`).

  Started again on the same workdir, it resumes from the newest readable
  checkpoint: parameters, optimizer state, step, RNG and data position.
  ``on_start`` runs once the checks that need no data passed, before the
  run writes anything to ``workdir``.
  """
  config = pretrain_config.of(config)  # before any work: a bad stage fails now
  mesh = sharding.make_mesh(config.mesh.shape)
  numbers = loop_config(config, sharding.batch_devices(mesh))  # and a bad number
  if config.optim.warmup_steps > numbers.steps:
    logging.warning("config.optim.warmup_steps=%d is more than config.train.steps=%d: "
                    "the run ends inside its learning-rate warmup",
                    config.optim.warmup_steps, numbers.steps)
  sources.check_files(config.data.source, (config.data.train_split, config.data.eval_split))
  for stage in config.stages:
    sources.check_files(stage.data.source, (stage.data.train_split,))
  source = load_source(config)
  on_start()
  os.makedirs(workdir, exist_ok=True)
  data = pipeline.DataSetup(config, workdir, process_index=jax.process_index(),
                            process_count=jax.process_count(),
                            tokenizer=source.tokenizer if source else None)
  model_cfg = architecture(config, source, data.tokenizer.vocab_size)
  check_positions(model_cfg, data.lengths, "config.data.seq_len")
  objective = objectives.get(config.objective.name)
  model = objective.build_model(model_cfg, config.objective)
  generator = _generator(model)
  if jax.process_index() == 0:  # Fine-tuning rebuilds the model from this, an
    # export ELECTRA's generator too.
    pretrained.save_model_config(model_cfg, workdir, generator=generator, asked=config.model)
  rules = sharding.make_rules(config.mesh.rules)
  tx, schedule = optim.make_optimizer(config.optim, config.train.steps)
  loss_fn = objective.make_loss_fn(model, data.max_predictions, config.objective)
  p_eval = jax.jit(functools.partial(step_lib.eval_step, loss_fn=loss_fn),
                   in_shardings=(None, sharding.batch_sharding(mesh)))

  def evaluate(params):
    return step_lib.evaluate(p_eval, params, (
        sharding.shard_batch(b, mesh)
        for b in data.eval_iterator(config.train.eval_batches)), objective.summarize)

  example = next(data.train_iterator())
  init_inputs = step_lib.lm_init_inputs(model, example)
  params_shape = nn.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), **init_inputs)))["params"]
  n_params = optim.count_params(params_shape)
  flops = perf.flops_per_example(model_cfg, params_shape,
                                 *data.lengths.values(),
                                 head_positions=data.max_predictions,
                                 generator=generator)
  logging.info("model: %s, %d parameters; %s rows train / %s eval; unigram "
               "entropy of training tokens %.3f nats", model_cfg.family,
               n_params, data.num_rows(data.train_split),
               data.num_rows(data.eval_split), data.unigram_entropy)
  if (cost := attention.attention_dropout_cost(model_cfg)) is not None:
    logging.warning(cost)
  load_params = source_loader(params_shape, source, config.init_from)
  where = lambda k: f"config.stages[{k}]" if config.stages else "config"
  stages = tuple(make_stage(k, stage, config.init_from, data, model_cfg, model,
                            params_shape, where(k), objective)
                 for k, stage in enumerate(config.run_stages()))
  work = workload.Workload(
      model=model,
      weight_fn=functools.partial(objective.weight_total, family=model_cfg.family),
      init_inputs=init_inputs, summarize=objective.summarize, stages=stages,
      evaluate=evaluate,
      info={"params": n_params, "flops_per_example": flops,
            "unigram_entropy": data.unigram_entropy},
      init_params=load_params)
  return loop.run(work, numbers, tx, schedule, mesh, rules,
                  workdir).eval_metrics
