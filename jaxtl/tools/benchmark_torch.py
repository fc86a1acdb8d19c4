"""The PyTorch side of :mod:`jaxtl.tools.benchmark`: the same model, batch and
optimizer in Hugging Face ``transformers``, timed the same way.

The model is built from the config :func:`jaxtl.convert.hf.hf_config` exports
for the jaxtl model, so both sides run one architecture, in the same
precision: float32, or bfloat16 autocast (on GPUs and CPUs alike) when
jaxtl computes in bfloat16; SDPA attention, and fused AdamW on every device:
what ``transformers``' Trainer uses by default with PyTorch 2.8 or later
(``adamw_torch_fused``). On a CPU, ``torch.optim.AdamW``'s own default (one
loop per parameter) made MiniLM's step 16% slower (docs: studies/performance).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from jaxtl.tools.presets import Measurement, Preset, make_batch, optimizer_config, time_steps
from jaxtl.convert import hf
from jaxtl.models import TransformerConfig

# Which transformers class trains each objective.
HF_CLASSES = {"clm": "GPT2LMHeadModel", "mlm": "BertForMaskedLM",
              "span": "T5ForConditionalGeneration",
              "classify": "BertForSequenceClassification"}


@dataclasses.dataclass
class TorchProgram:
  """The same model's train step in transformers, built and stepped once."""
  run_step: Callable[[], None]
  first_s: float  # the first step: allocation, kernel selection
  peak: Callable[[], int | None]  # peak device memory, None on a CPU

  def measurement(self, step_s: float) -> Measurement:
    peak = self.peak()
    return Measurement(step_s, self.first_s, peak, "none" if peak is None else "torch.cuda")


def run_torch(preset: Preset, cfg: TransformerConfig, warmup: int, steps: int,
              seed: int = 0) -> Measurement:
  """Times the same model's step in transformers (PyTorch)."""
  program = torch_program(preset, cfg, seed)
  return program.measurement(time_steps(program.run_step, max(warmup - 1, 0), steps))


def torch_program(preset: Preset, cfg: TransformerConfig, seed: int = 0) -> TorchProgram:
  """The same model, batch and optimizer as jaxtl's step in transformers,
  stepped once."""
  # optional (pip install 'jaxtl[hf]'), heavy: ~2 s; only the PyTorch anchor needs them
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  hf_config = hf.hf_config(cfg)
  if preset.objective == "classify":
    hf_config["num_labels"] = preset.num_labels
  if preset.objective == "clm":  # GPT-2's 50256 is outside tiny vocabularies
    hf_config.update(bos_token_id=preset.vocab_size - 1, eos_token_id=preset.vocab_size - 1)
  config = transformers.AutoConfig.for_model(**hf_config)
  torch.manual_seed(seed)
  model = getattr(transformers, HF_CLASSES[preset.objective])._from_config(
      config, attn_implementation="sdpa").to(device).train()
  # Token ids as int64: torch's losses take no other index type.
  batch = {k: torch.from_numpy(np.ascontiguousarray(
      v.astype(np.int64) if v.dtype.kind == "i" else v)).to(device)
           for k, v in make_batch(preset, seed).items()}
  if preset.objective == "clm":
    inputs = {"input_ids": batch["decoder_input_tokens"],
              "labels": batch["decoder_input_tokens"]}  # HF shifts labels itself
  elif preset.objective == "mlm":
    labels = torch.where(batch["encoder_loss_weights"] > 0,
                         batch["encoder_target_tokens"], -100)
    inputs = {"input_ids": batch["encoder_input_tokens"], "labels": labels}
  elif preset.objective == "span":
    inputs = {"input_ids": batch["encoder_input_tokens"],
              "labels": batch["decoder_target_tokens"]}
  else:
    inputs = {"input_ids": batch["encoder_input_tokens"],
              "attention_mask": batch["encoder_segment_ids"],
              "labels": batch["labels"]}
  # Decay on matrices only, as jaxtl's optimizer does.
  no_decay = [p for p in model.parameters() if p.ndim < 2]
  decay = [p for p in model.parameters() if p.ndim >= 2]
  opt_cfg = optimizer_config()
  opt = torch.optim.AdamW(
      [{"params": decay, "weight_decay": opt_cfg.weight_decay},
       {"params": no_decay, "weight_decay": 0.0}],
      lr=opt_cfg.lr, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps, fused=True)
  autocast = torch.autocast(device.type, torch.bfloat16, enabled=cfg.dtype == "bfloat16")

  def run_step():
    opt.zero_grad(set_to_none=True)
    with autocast:
      loss = model(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.clip_norm)
    opt.step()
    if cuda:
      torch.cuda.synchronize()

  if cuda:
    torch.cuda.reset_peak_memory_stats()
  start = time.perf_counter()
  run_step()
  return TorchProgram(run_step, time.perf_counter() - start,
                      lambda: torch.cuda.max_memory_allocated() if cuda else None)


def release_memory() -> None:
  """Hands PyTorch's cached device memory back (for jax, which runs next)."""
  # optional (pip install 'jaxtl[hf]'), heavy: ~2 s
  import torch  # pylint: disable=g-import-not-at-top
  if torch.cuda.is_available():
    torch.cuda.empty_cache()
