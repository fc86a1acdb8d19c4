"""What a run reports: metrics.jsonl, TensorBoard events and the console."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping

import jax
import numpy as np

from jaxtl import objectives


def summarize_train(window: list[dict[str, Any]], seconds: float,
                     batch_size: int, flops_per_example: float,
                     peak_per_device: float | None, tokens_per_example: int
                     ) -> dict[str, float]:
  """Averages a window of step metrics and adds throughput and MFU."""
  sums = {k: sum(float(m[k]) for m in window)
          for k in ("loss_sum", "correct_sum", "weight_sum")}
  out = objectives.summarize(sums)
  out["grad_norm"] = float(np.mean([m["grad_norm"] for m in window]))
  out["learning_rate"] = float(window[-1]["learning_rate"])
  out["skipped_steps"] = int(sum(int(m["skipped"]) for m in window))
  steps_per_s = len(window) / max(seconds, 1e-9)
  out["steps_per_s"] = steps_per_s
  if tokens_per_example:  # 0: varies by batch (fine-tuning cuts padding)
    out["tokens_per_s"] = steps_per_s * batch_size * tokens_per_example
  if peak_per_device and flops_per_example:  # unknown on CPUs: no MFU, not a NaN
    out["mfu"] = (steps_per_s * batch_size * flops_per_example
                  / (peak_per_device * jax.device_count()))
  return out


class MetricsWriter:
  """metrics.jsonl (one JSON object per line) + TensorBoard event files."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, split: str, metrics: Mapping[str, Any],
            total: int = 0) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split,
              **{k: float(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    for k, v in metrics.items():
      self._tb.add_scalar(f"{split}/{k}", float(v), int(step))
    if split != "info":
      logging.info("step %s %s: %s", f"{step}/{total}" if total else step, split,
                   ", ".join(f"{k}={float(v):.4g}" for k, v in metrics.items()))

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()
