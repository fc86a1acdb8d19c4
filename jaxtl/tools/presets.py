"""The benchmark presets: a model, an objective, a batch shape; the
synthetic batch and the jaxtl model, loss and optimizer each runs.

Shared by the step benchmark (:mod:`jaxtl.tools.benchmark`), its PyTorch
side (:mod:`jaxtl.tools.benchmark_torch`) and the memory and pipeline
figures (:mod:`jaxtl.tools.footprint`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxtl import objectives, train
from jaxtl.configs import models
from jaxtl.models import TransformerConfig, build_model
from jaxtl.models.heads import TaskModel
from jaxtl.tasks import finetune
from jaxtl.train import optim

OBJECTIVES = ("clm", "mlm", "span", "classify")
MASK_RATE = 0.15  # MLM: the share of positions that carry loss.


@dataclasses.dataclass(frozen=True)
class Preset:
  """One benchmark: a ``configs/models.py`` model, an objective and a shape.

  Attributes:
    model: Name in ``jaxtl.configs.models.PRESETS``.
    objective: ``clm`` (decoder), ``mlm`` (encoder), ``span`` (T5 span
      corruption: ``length`` inputs, ``target_length`` targets) or
      ``classify`` (an encoder with BERT's pooler and a classifier).
    batch_size: Rows per step (global, over all devices).
    length: Input tokens per row.
    target_length: Decoder tokens per row (``span`` only).
    vocab_size: The model's vocabulary.
    num_labels: Classes (``classify`` only).
    accelerator_batch_size: Rows per step *per device* on GPUs and TPUs
      (0: ``batch_size``). The CPU batches leave an H100 waiting on
      launches and elementwise passes; these are the batches that filled
      it best in the sweep of ``launch/benchmark_results.md`` (2026-11-23).
  """
  model: str
  objective: str
  batch_size: int
  length: int
  vocab_size: int
  target_length: int = 0
  num_labels: int = 0
  accelerator_batch_size: int = 0

  @property
  def tokens_per_row(self) -> int:
    return self.length + self.target_length


PRESETS: dict[str, Preset] = {
    # The presets: GPT-2 small at 1024, BERT-base MLM at 512, T5-small
    # span corruption (512 inputs; 15% noise, mean span 3 -> 114 targets), and
    # the TREC fine-tuning shape of the MiniLM recipe. GPT-2's 50257 tokens
    # are padded to 50304 (a multiple of 128, as jaxtl's recipes pad
    # vocabularies), which also lets the vocabulary shard over tensor axes;
    # PyTorch runs the same padded model.
    # On an H100, batch 8 -> 16 took GPT-2's MFU from 26% to 30%, BERT's
    # 16 -> 64 from 16% to 28% and T5's 32 -> 128 from 14% to 21%.
    "gpt2_small": Preset("gpt2_small", "clm", 8, 1024, 50304, accelerator_batch_size=16),
    "bert_base": Preset("bert_base", "mlm", 16, 512, 30522, accelerator_batch_size=64),
    "t5_small": Preset("t5_small", "span", 32, 512, 32128, target_length=114,
                       accelerator_batch_size=128),
    "minilm_cls": Preset("minilm_l6", "classify", 32, 64, 30522, num_labels=6),
    # Seconds-long smoke runs on a CPU (and in the tests).
    "tiny_gpt2": Preset("gpt2_tiny", "clm", 4, 128, 1024),
    "tiny_bert": Preset("bert_tiny", "mlm", 4, 128, 1024),
    "tiny_t5": Preset("t5_tiny", "span", 4, 128, 1024, target_length=32),
    "tiny_cls": Preset("bert_tiny", "classify", 8, 64, 1024, num_labels=6),
}

def on_accelerator() -> bool:
  return jax.devices()[0].platform != "cpu"


def lookup(names: list[str]) -> list[Preset]:
  """The named presets, or an error naming the unknown ones."""
  unknown = sorted(set(names) - set(PRESETS))
  if unknown:
    raise ValueError(f"unknown benchmark presets {unknown}; known: {sorted(PRESETS)}")
  return [PRESETS[name] for name in names]


def model_config(preset: Preset, dtype: str, **overrides: Any) -> TransformerConfig:
  """The preset's TransformerConfig, computing in ``dtype`` (``auto``: what
  the recipes compute in on this device)."""
  if preset.model not in models.PRESETS:
    raise ValueError(f"preset model {preset.model!r} is not in configs/models.py; "
                     f"known: {sorted(models.PRESETS)}")
  values = {**models.PRESETS[preset.model], "vocab_size": preset.vocab_size,
            "dtype": dtype, **overrides}
  return TransformerConfig.from_mapping(values, keep_float32="--dtype=float32")


def optimizer_config(lr: float = 1e-4) -> optim.OptimConfig:
  """AdamW + clipping, as both sides run it (constant rate: no warmup effects)."""
  return optim.OptimConfig(lr=lr, warmup_steps=0, schedule="constant", end_lr_ratio=1.0,
                           weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0,
                           accum_steps=1)


def make_batch(preset: Preset, seed: int = 0) -> dict[str, np.ndarray]:
  """A synthetic batch in the layout jaxtl's loss for the objective reads."""
  rng = np.random.default_rng(seed)
  b, t = preset.batch_size, preset.length
  tokens = lambda n: rng.integers(1, preset.vocab_size, (b, n), dtype=np.int32)
  if preset.objective == "clm":
    seq = tokens(t + 1)
    return {"decoder_input_tokens": seq[:, :-1], "decoder_target_tokens": seq[:, 1:],
            "decoder_loss_weights": np.ones((b, t), np.float32)}
  if preset.objective == "mlm":
    weights = np.zeros((b, t), np.float32)
    k = max_predictions(preset)
    for row in weights:
      row[rng.choice(t, k, replace=False)] = 1.0
    return {"encoder_input_tokens": tokens(t), "encoder_target_tokens": tokens(t),
            "encoder_loss_weights": weights}
  if preset.objective == "span":
    n = preset.target_length
    targets = tokens(n)
    return {"encoder_input_tokens": tokens(t),
            "decoder_input_tokens": np.concatenate(
                [np.zeros((b, 1), np.int32), targets[:, :-1]], 1),
            "decoder_target_tokens": targets,
            "decoder_loss_weights": np.ones((b, n), np.float32)}
  if preset.objective == "classify":
    return {"encoder_input_tokens": tokens(t),
            "encoder_segment_ids": np.ones((b, t), np.int32),
            "encoder_positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
            "labels": rng.integers(0, preset.num_labels, b, dtype=np.int32),
            "label_weights": np.ones(b, np.float32)}
  raise ValueError(f"unknown objective {preset.objective!r}; known: {OBJECTIVES}")


def max_predictions(preset: Preset) -> int:
  """Loss positions per MLM row, as the data pipeline bounds them."""
  return int(np.ceil(MASK_RATE * preset.length))


@dataclasses.dataclass
class Measurement:
  """One side's figures for one preset."""
  step_s: float
  compile_s: float
  peak_bytes: int | None
  memory_source: str

  def tokens_per_s(self, preset: Preset) -> float:
    return preset.batch_size * preset.tokens_per_row / self.step_s


def time_steps(run_step: Callable[[], Any], warmup: int, steps: int) -> float:
  """Median wall time of ``run_step`` (which must block until done)."""
  return time_alternated([run_step], warmup, steps, rounds=1)[0][0]


def time_alternated(runs: list[Callable[[], Any]], warmup: int, steps: int,
                    rounds: int) -> tuple[list[float], list[int]]:
  """Median wall time of each of ``runs`` (which must block until done), and
  in how many rounds each was the fastest.

  The runs take turns, ``steps`` steps each per round, in the opposite
  order every other round. A change measured so, both programs in one
  process, sees the host's noise as its baseline does: on a shared 2-core
  host the same command ran 20-35% apart between processes, more than most
  changes are worth (docs: studies/performance).
  """
  for run in runs:
    for _ in range(warmup):
      run()
  times: list[list[float]] = [[] for _ in runs]
  wins = [0] * len(runs)
  for r in range(rounds):
    medians = {}
    for i in (range(len(runs)) if r % 2 == 0 else reversed(range(len(runs)))):
      ours = []
      for _ in range(steps):
        start = time.perf_counter()
        runs[i]()
        ours.append(time.perf_counter() - start)
      times[i] += ours
      medians[i] = statistics.median(ours)
    wins[min(medians, key=medians.__getitem__)] += 1
  return [statistics.median(t) for t in times], wins


def faster_in(wins: int, rounds: int, runs: int = 2) -> str:
  """How often one of :func:`time_alternated`'s runs was the fastest, as
  "W of R rounds (p=...)", with p the chance of at least that many wins if
  all ``runs`` were equally fast (a one-sided binomial tail, each round won
  with probability ``1 / runs``).

  A win count alone misleads on a shared host: 4 of 6 rounds happens by
  chance a third of the time (p=0.34), 6 of 6 once in 64 (p=0.016). With
  one step per round (``steps=1``) and many rounds, a change of 1-2% can
  be told from noise: 49 of 80 rounds is p=0.03."""
  p = sum(math.comb(rounds, k) * (runs - 1) ** (rounds - k)
          for k in range(wins, rounds + 1)) / runs ** rounds
  return f"{wins} of {rounds} rounds (p={p:.2g})"


def peak_memory(compiled: Any = None) -> tuple[int | None, str]:
  """(peak bytes, where they came from) of the first local device: its
  ``memory_stats()`` where it keeps them (GPUs, TPUs), else the compiled
  step's ``memory_analysis()`` (arguments + outputs - aliased + temps)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "memory_stats"
  analysis = compiled and compiled.memory_analysis()
  if analysis is None:
    return None, "none"
  total = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
           - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
  return int(total), "memory_analysis"


def jaxtl_step(preset: Preset, cfg: TransformerConfig,
               loss_chunk_len: int = objectives.LOSS_CHUNK_LEN
               ) -> tuple[Any, Any, Callable]:
  """(model, loss_fn, weight_fn) of the preset's objective, as training runs it."""
  if preset.objective == "classify":
    model = TaskModel(cfg, kind="classification", num_labels=preset.num_labels,
                      pooling="pooler", dropout_rate=cfg.dropout_rate)
    return model, finetune.make_task_loss_fn(model), lambda b: jnp.sum(b["label_weights"])
  model = build_model(cfg)
  loss_fn = objectives.make_loss_fn(
      model, max_predictions(preset) if preset.objective == "mlm" else None,
      loss_chunk_len)
  return model, loss_fn, functools.partial(objectives.loss_weight_total, family=cfg.family)


def init_inputs(model: Any, preset: Preset, batch: dict[str, np.ndarray]) -> dict[str, Any]:
  """Keyword arguments of ``model.init`` for the preset's model."""
  if preset.objective == "classify":
    return {"tokens_BT": batch["encoder_input_tokens"][:1]}
  return train.lm_init_inputs(model, batch)
