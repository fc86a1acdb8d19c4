"""Pretraining: a corpus and an objective, handed to the one training loop."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any

import flax.linen as nn
import jax

from jaxtl import objectives
from jaxtl.data import pipeline
from jaxtl.models import TransformerConfig, build_model
from jaxtl.train import loop, optim, perf, sharding
from jaxtl.train import step as step_lib

MODEL_CONFIG_FILE = "model_config.json"


def save_model_config(cfg: TransformerConfig, workdir: str) -> None:
  with open(os.path.join(workdir, MODEL_CONFIG_FILE), "w") as f:
    json.dump(dataclasses.asdict(cfg), f, indent=1)


def load_model_config(workdir: str) -> TransformerConfig:
  """The architecture a pretraining workdir was trained with."""
  path = os.path.join(workdir, MODEL_CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: init_from must be a jaxtl "
                            "pretraining workdir")
  with open(path) as f:
    values = json.load(f)
  values["lora_targets"] = tuple(values.get("lora_targets", ()))
  return TransformerConfig.from_mapping(values)


def model_config_from(config: Any, vocab_size: int) -> TransformerConfig:
  """config.model -> TransformerConfig; vocab_size 0 means "the tokenizer's"."""
  values = dict(config.model)
  if not values.get("vocab_size"):
    multiple = config.vocab_multiple
    values["vocab_size"] = -(-vocab_size // multiple) * multiple
  elif values["vocab_size"] < vocab_size:
    raise ValueError(f"config.model.vocab_size={values['vocab_size']} is smaller "
                     f"than the tokenizer's {vocab_size} ids")
  return TransformerConfig.from_mapping(values)


def loop_config(config: Any) -> loop.LoopConfig:
  """The loop's numbers from a pretraining config (all in steps)."""
  t = config.train
  return loop.LoopConfig(
      steps=t.steps, batch_size=config.data.batch_size, log_every=t.log_every,
      eval_every=t.eval_every, eval_at_start=True,
      checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints,
      max_bad_steps=t.max_bad_steps, accum_steps=config.optim.accum_steps,
      prefetch=config.data.prefetch, peak_flops=t.peak_flops, seed=config.seed)


def train_and_evaluate(config: Any, workdir: str) -> dict[str, float]:
  """Pretrains per ``config`` into ``workdir``; returns the final eval metrics.

  Started again on the same workdir, it resumes from the newest readable
  checkpoint: parameters, optimizer state, step, RNG and data position.
  """
  os.makedirs(workdir, exist_ok=True)
  objectives.check_objective(config.objective.name, config.model.family)
  data = pipeline.DataSetup(config, workdir, process_index=jax.process_index(),
                            process_count=jax.process_count())
  model_cfg = model_config_from(config, data.tokenizer.vocab_size)
  if jax.process_index() == 0:  # Fine-tuning rebuilds the model from this.
    save_model_config(model_cfg, workdir)
  model = build_model(model_cfg)
  mesh = sharding.make_mesh(config.mesh.shape)
  rules = sharding.make_rules(config.mesh.rules)
  tx, schedule = optim.make_optimizer(config.optim, config.train.steps)
  loss_fn = objectives.make_loss_fn(model, data.max_predictions,
                                    config.objective.loss_chunk_len)
  batches = data.train_iterator()
  p_eval = jax.jit(functools.partial(step_lib.eval_step, loss_fn=loss_fn),
                   in_shardings=(None, sharding.batch_sharding(mesh)))

  def evaluate(params):
    return step_lib.evaluate(p_eval, params, (
        sharding.shard_batch(b, mesh)
        for b in data.eval_iterator(config.train.eval_batches)))

  example = next(data.train_iterator())
  init_inputs = step_lib.lm_init_inputs(model, example)
  params_shape = nn.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), **init_inputs)))["params"]
  n_params = optim.count_params(params_shape)
  flops = perf.flops_per_example(model_cfg, params_shape,
                                 *data.lengths.values(),
                                 head_positions=data.max_predictions)
  logging.info("model: %s, %d parameters; %s rows train / %s eval; unigram "
               "entropy of training tokens %.3f nats", model_cfg.family,
               n_params, data.num_rows(data.train_split),
               data.num_rows(data.eval_split), data.unigram_entropy)
  work = loop.Workload(
      model=model, loss_fn=loss_fn,
      weight_fn=functools.partial(objectives.loss_weight_total, family=model_cfg.family),
      init_inputs=init_inputs, batches=batches, evaluate=evaluate,
      flops_per_example=flops, tokens_per_example=sum(data.lengths.values()),
      info={"params": n_params, "flops_per_example": flops,
            "unigram_entropy": data.unigram_entropy})
  return loop.run(work, loop_config(config), tx, schedule, mesh, rules,
                  workdir).eval_metrics
