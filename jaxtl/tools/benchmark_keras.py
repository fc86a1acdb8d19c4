"""The KerasHub side of :mod:`jaxtl.tools.benchmark`: the same architecture,
batch and optimizer built from config in ``keras-hub`` on the JAX backend,
timed the same way.

KerasHub is the other Transformer library on JAX, so this side tells how much
of jaxtl's speed is jaxtl's and how much is XLA's. Each preset becomes the
KerasHub task a user would train (``GPT2CausalLM``, ``BertMaskedLM``,
``T5Seq2SeqLM``, ``BertTextClassifier``) at the preset's shape, compiled with
AdamW (decay off biases and norms), global-norm clipping and the
sparse cross-entropy from logits, and stepped with ``train_on_batch``: Keras's
own jitted train step. On GPUs and TPUs it computes in ``mixed_bfloat16``.

It runs in a child process (:func:`main`):
Keras fixes its backend at import and keeps global state, its device memory
must not count in jaxtl's peak, and keras-hub imports TensorFlow when it is
installed, which this child blocks (KerasHub needs it only for ``tf.data``
preprocessing, and its thread pools would share the CPU with the step). The
child inherits this process's environment, so XLA gets the same flags on both
sides.

Install: ``pip install --no-deps keras-hub`` next to ``keras`` (which
``jaxtl[tfds]`` brings); without ``--no-deps`` it pulls all of TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
import warnings
from typing import Any

import jax
import numpy as np

from jaxtl.models import TransformerConfig
from jaxtl.tools.presets import (Measurement, Preset, make_batch, optimizer_config,
                                 peak_memory, time_steps)

INSTALL_HINT = ("the KerasHub side needs keras-hub and keras: "
                "pip install keras && pip install --no-deps keras-hub")


def available() -> bool:
  """Whether keras-hub and keras are installed (without importing them)."""
  return all(importlib.util.find_spec(m) for m in ("keras_hub", "keras"))


def run_keras(jobs: list[tuple[Preset, TransformerConfig]], warmup: int, steps: int,
              seed: int = 0) -> list[Measurement]:
  """Times each (preset, config) in KerasHub, all in one child process."""
  if not available():
    raise ImportError(INSTALL_HINT)
  spec = {"jobs": [{"preset": dataclasses.asdict(p), "config": dataclasses.asdict(c)}
                   for p, c in jobs],
          "warmup": warmup, "steps": steps, "seed": seed}
  proc = subprocess.run([sys.executable, "-c", f"import {__name__} as m; m.main()"],
                        input=json.dumps(spec),
                        stdout=subprocess.PIPE, text=True, check=False,
                        env={**os.environ, "KERAS_BACKEND": "jax"})
  if proc.returncode:
    raise RuntimeError(f"the KerasHub side failed (exit {proc.returncode}); "
                       "its messages are above")
  return [Measurement(**m) for m in json.loads(proc.stdout.strip().splitlines()[-1])]


def _check_shape(preset: Preset, cfg: TransformerConfig) -> None:
  """KerasHub derives what jaxtl configures: say which preset does not fit."""
  if preset.objective != "span" and cfg.head_dim * cfg.num_heads != cfg.d_model:
    raise ValueError(f"{preset.model}: KerasHub's BERT and GPT-2 split d_model "
                     f"{cfg.d_model} over {cfg.num_heads} heads; head_dim is "
                     f"{cfg.head_dim}")
  if preset.objective == "span" and cfg.num_decoder_layers not in (0, cfg.num_layers):
    raise ValueError(f"{preset.model}: KerasHub's T5 has one depth for both stacks; "
                     f"num_layers {cfg.num_layers}, num_decoder_layers "
                     f"{cfg.num_decoder_layers}")


def _activation(name: str) -> Any:
  """jaxtl's activation names as Keras takes them (gelu_new: the tanh GELU)."""
  import keras  # pylint: disable=g-import-not-at-top
  if name == "gelu_new":
    return lambda x: keras.activations.gelu(x, approximate=True)
  return name


def build_task(preset: Preset, cfg: TransformerConfig) -> Any:
  """The preset's model as a KerasHub task, untrained, without a preprocessor."""
  _check_shape(preset, cfg)
  import keras_hub  # pylint: disable=g-import-not-at-top
  common = {"vocabulary_size": cfg.vocab_size, "num_layers": cfg.num_layers,
            "num_heads": cfg.num_heads, "hidden_dim": cfg.d_model,
            "intermediate_dim": cfg.mlp_dim, "dropout": cfg.dropout_rate,
            "dtype": "mixed_bfloat16" if cfg.dtype == "bfloat16" else "float32"}
  models = keras_hub.models
  if preset.objective == "clm":
    backbone = models.GPT2Backbone(**common, max_sequence_length=cfg.max_len)
    return models.GPT2CausalLM(backbone, preprocessor=None)
  if preset.objective == "span":
    backbone = models.T5Backbone(
        **common, key_value_dim=cfg.head_dim, activation=_activation(cfg.activation),
        use_gated_activation=cfg.gated_mlp, layer_norm_epsilon=cfg.norm_eps,
        tie_embedding_weights=cfg.tie_embeddings)
    return models.T5Seq2SeqLM(backbone, preprocessor=None)
  backbone = models.BertBackbone(**common, max_sequence_length=cfg.max_len,
                                 num_segments=max(cfg.type_vocab_size, 1))
  if preset.objective == "mlm":
    return models.BertMaskedLM(backbone, preprocessor=None)
  return models.BertTextClassifier(backbone, num_classes=preset.num_labels,
                                   preprocessor=None, dropout=cfg.dropout_rate)


def keras_batch(preset: Preset, seed: int = 0) -> tuple[dict[str, Any], Any, Any]:
  """(inputs, labels, sample weights): the benchmark's batch as the task reads it."""
  batch = make_batch(preset, seed)
  if preset.objective == "clm":
    tokens = batch["decoder_input_tokens"]
    return ({"token_ids": tokens, "padding_mask": np.ones(tokens.shape, bool)},
            batch["decoder_target_tokens"], batch["decoder_loss_weights"])
  if preset.objective == "span":
    enc, dec = batch["encoder_input_tokens"], batch["decoder_input_tokens"]
    return ({"encoder_token_ids": enc, "encoder_padding_mask": np.ones(enc.shape, bool),
             "decoder_token_ids": dec, "decoder_padding_mask": np.ones(dec.shape, bool)},
            batch["decoder_target_tokens"], batch["decoder_loss_weights"])
  tokens = batch["encoder_input_tokens"]
  inputs = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens),
            "padding_mask": np.ones(tokens.shape, bool)}
  if preset.objective == "classify":
    inputs["padding_mask"] = batch["encoder_segment_ids"] > 0
    return inputs, batch["labels"], batch["label_weights"]
  # MLM: BertMaskedLM predicts at given positions, the rows' loss positions.
  weights = batch["encoder_loss_weights"]
  positions = np.nonzero(weights)[1].reshape(len(weights), -1).astype(np.int32)
  inputs["mask_positions"] = positions
  labels = np.take_along_axis(batch["encoder_target_tokens"], positions, 1)
  return inputs, labels, np.ones(positions.shape, np.float32)


def measure(preset: Preset, cfg: TransformerConfig, warmup: int, steps: int,
            seed: int = 0) -> Measurement:
  """Times ``train_on_batch`` on the preset (in this process: Keras's backend
  must already be JAX)."""
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(seed)
  task = build_task(preset, cfg)
  opt_cfg = optimizer_config()
  opt = keras.optimizers.AdamW(
      learning_rate=opt_cfg.lr, weight_decay=opt_cfg.weight_decay, beta_1=opt_cfg.b1,
      beta_2=opt_cfg.b2, epsilon=opt_cfg.eps, global_clipnorm=opt_cfg.clip_norm)
  opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
  task.compile(optimizer=opt, weighted_metrics=[], jit_compile=True,
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  inputs, labels, weights = jax.device_put(keras_batch(preset, seed))

  def run_step():  # returns the loss as numpy: waits for the step
    task.train_on_batch(inputs, labels, sample_weight=weights)

  start = time.perf_counter()
  run_step()  # the first step: tracing and XLA compilation
  first_s = time.perf_counter() - start
  step_s = time_steps(run_step, max(warmup - 1, 0), steps)
  return Measurement(step_s, first_s, *peak_memory())  # Keras's step is not ours to analyse


def main() -> None:
  """The child: reads the jobs as JSON on stdin, prints the measurements as
  one JSON line."""
  if os.environ.get("KERAS_BACKEND") != "jax":
    raise SystemExit("run with KERAS_BACKEND=jax (jaxtl.tools.benchmark sets it)")
  sys.modules["tensorflow"] = None  # see the module docstring
  # KerasHub's T5 warns on every call that its attention drops Keras masks
  # (it takes the padding mask as an input instead).
  warnings.filterwarnings("ignore", "Layer .* does not support masking", UserWarning)
  spec = json.load(sys.stdin)
  out = []
  for job in spec["jobs"]:
    preset = Preset(**job["preset"])
    cfg = TransformerConfig.from_mapping(job["config"])
    out.append(dataclasses.asdict(measure(preset, cfg, spec["warmup"], spec["steps"],
                                          spec["seed"])))
  print(json.dumps(out), flush=True)

