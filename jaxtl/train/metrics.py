"""What a run reports: metrics.jsonl, TensorBoard events and the console.

The console gets one log line per logged window: ``step N/T train (ETA
mm:ss): loss=...``; on a terminal, progress bars too, with log lines
printed above them (not glued onto the bar's line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np
import tqdm

from jaxtl import layout


def summarize_train(window: list[dict[str, Any]], seconds: float,
                     batch_size: int, flops_per_example: float,
                     peak_per_device: float | None, tokens_per_example: int,
                     summarize: Callable[[Mapping[str, float]], dict[str, float]]
                     ) -> dict[str, float]:
  """Averages a window of step metrics (``summarize``, the workload's, turns
  their sums into the loss and its company) and adds throughput and MFU."""
  sums = {k: sum(float(m[k]) for m in window)  # the token loss's, NSP's too
          for k in window[0] if k.endswith("_sum")}
  out = summarize(sums)
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


def _summary_writer_class() -> type:
  """tensorboardX's SummaryWriter, imported without PyTorch: tensorboardX
  imports torch when it is installed only to accept its tensors, which we
  never log, and that import costs every run (every CLI start) ~2 CPU s."""
  # heavy: imported on first use, with torch blocked (above), by both imports
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    return SummaryWriter
  sys.modules["torch"] = None  # makes ``import torch`` raise ImportError
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricsWriter:
  """metrics.jsonl (one JSON object per line) + TensorBoard event files.

  ``keep_through`` is the step the run goes on from: records after it, which
  a killed run wrote and the resumed one writes again, are dropped first, so
  the file holds one record per step and split (-1: a fresh start, none kept).
  Records of ``drop_splits`` (the final test score) go too: the run writes
  them again at its end.
  """

  def __init__(self, workdir: str, enabled: bool = True, keep_through: int = -1,
               drop_splits: tuple[str, ...] = ()):
    self.enabled = enabled
    if not enabled:
      return
    path = layout.metrics_file(workdir)
    _truncate_after(path, keep_through, drop_splits)
    self._jsonl = open(path, "a")
    self._tb = _summary_writer_class()(layout.tensorboard_dir(workdir))

  def write(self, step: int, split: str, metrics: Mapping[str, Any],
            total: int = 0, eta: float | None = None) -> None:
    """Logs ``metrics``; ``total`` and ``eta`` (seconds) go to the console
    line only, not to the files."""
    if not self.enabled:
      return
    record = {"step": int(step), "split": split,
              **{k: float(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    for k, v in metrics.items():
      self._tb.add_scalar(f"{split}/{k}", float(v), int(step))
    if split != "info":
      logging.info("step %s %s%s: %s", f"{step}/{total}" if total else step, split,
                   "" if eta is None else f" (ETA {tqdm.tqdm.format_interval(eta)})",
                   brief(metrics))

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def brief(metrics: Mapping[str, Any]) -> str:
  """``loss=6.863, accuracy=0.1097``: each number to four significant
  digits, as the console shows them."""
  def number(v: Any) -> str:
    try:
      return f"{float(v):.4g}"
    except (TypeError, ValueError):  # a list of scores, a text
      return str(v)
  return ", ".join(f"{k}={number(v)}" for k, v in metrics.items())


def _truncate_after(path: str, step: int, drop_splits: tuple[str, ...] = ()) -> None:
  """Rewrites ``path`` (atomically) without the records of steps after
  ``step`` and those of ``drop_splits``."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
      if record["step"] <= step and record["split"] not in drop_splits:
        kept.append(line if line.endswith("\n") else line + "\n")
    except (ValueError, KeyError, TypeError):
      continue  # a line cut short by a kill
  if len(kept) == len(lines):
    return
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(kept)
  os.replace(tmp, path)


class Eta:
  """Seconds left, at the pace since the first call.

  The first call (the first logged window, which also paid for compiling
  the step) falls back to the pace since construction; later ones leave
  the compile time out, and take evaluations and checkpoints in.
  """

  def __init__(self, total: int, start: int):
    self.total = total
    self._mark = (start, time.perf_counter())
    self._marked = False

  def __call__(self, at: int) -> float | None:
    """None when done, or before any step was timed."""
    now = time.perf_counter()
    since_step, since = self._mark
    if not self._marked:
      self._mark, self._marked = (at, now), True
    if at >= self.total or at <= since_step:
      return None
    return (self.total - at) * (now - since) / (at - since_step)


def progress_bar(iterable: Iterable[Any] | None = None, *, total: int | None = None,
                 desc: str = "", enabled: bool = True, min_total: int = 0,
                 **kwargs: Any) -> tqdm.tqdm:
  """A tqdm bar on stderr, shown only when stderr is a terminal.

  In a log file, bars are carriage-return noise: there the log lines carry
  the progress. While a bar is open, log lines are written above it.
  ``min_total``: no bar for fewer steps (it would only flash).
  """
  if total is None and hasattr(iterable, "__len__"):
    total = len(iterable)  # type: ignore[arg-type]
  show = enabled and sys.stderr.isatty() and (total is None or total >= min_total)
  return _Bar(iterable, total=total, desc=desc, disable=not show,
              dynamic_ncols=True, **kwargs)


class _Bar(tqdm.tqdm):
  """A tqdm bar that routes console log handlers through ``tqdm.write``
  while it is open."""

  def __init__(self, *args: Any, **kwargs: Any):
    self._swapped: list[tuple[logging.Handler, logging.Handler]] = []
    super().__init__(*args, **kwargs)
    if not self.disable:
      self._swapped = _log_above_bars()

  def close(self) -> None:
    super().close()
    _restore_handlers(self._swapped)
    self._swapped = []


class _AboveBars(logging.Handler):
  """Prints what ``handler`` would print with ``tqdm.write``, which clears
  the open bars, writes the line and redraws them.

  absl's handler is not a ``StreamHandler`` (its python_handler is), so
  ``tqdm.contrib.logging.logging_redirect_tqdm`` would pass it over.
  """

  def __init__(self, handler: logging.Handler, stream: Any):
    super().__init__(handler.level)
    self.handler, self.stream = handler, stream

  def filter(self, record: logging.LogRecord) -> bool:
    return bool(self.handler.filter(record))  # its filters still apply

  def emit(self, record: logging.LogRecord) -> None:
    if record.levelno >= logging.FATAL:  # absl aborts after printing these
      self.handler.emit(record)
      return
    try:
      tqdm.tqdm.write(self.handler.format(record), file=self.stream)
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)


def _log_above_bars() -> list[tuple[logging.Handler, logging.Handler]]:
  """Swaps the root logger's console handlers for :class:`_AboveBars`;
  returns (original, replacement) pairs. Nothing when an outer bar did."""
  root = logging.getLogger()
  if any(isinstance(h, _AboveBars) for h in root.handlers):
    return []
  swapped = []
  for h in root.handlers:
    stream = getattr(getattr(h, "python_handler", h), "stream", None)
    if stream is not None and stream in (sys.stderr, sys.stdout):
      swapped.append((h, _AboveBars(h, stream)))
  replace = dict(swapped)
  root.handlers = [replace.get(h, h) for h in root.handlers]
  return swapped


def _restore_handlers(swapped: list[tuple[logging.Handler, logging.Handler]]) -> None:
  if not swapped:
    return
  root = logging.getLogger()
  original = {new: old for old, new in swapped}
  root.handlers = [original.get(h, h) for h in root.handlers]


def loss_totals(window: list[Mapping[str, Any]]) -> dict[str, float]:
  """Loss and weight summed over a window of steps (JSON: for checkpoints)."""
  return {k: sum(float(m[k]) for m in window) for k in ("loss_sum", "weight_sum")}


def mean_loss(window: list[Mapping[str, Any]]) -> float | None:
  """Mean training loss (per unit of loss weight) over a window of steps."""
  if not window:
    return None
  totals = loss_totals(window)
  return totals["loss_sum"] / max(totals["weight_sum"], 1.0)


def train_progress(total: int, start: int, steps_per_epoch: int, enabled: bool) -> tqdm.tqdm:
  """The training loop's bar of steps (and epochs, where it has them) on a
  terminal; nothing when output goes to a file (the log lines say the
  step, the loss and the ETA there)."""
  bar = progress_bar(total=total, initial=start, unit="step", desc="train",
                     enabled=enabled)
  advance(bar, start, steps_per_epoch, total, update=False)
  return bar


def advance(bar: tqdm.tqdm, at: int, steps_per_epoch: int, total: int,
            update: bool = True) -> None:
  """Moves :func:`train_progress`'s bar to step ``at`` and names its epoch."""
  if update:
    bar.update(1)
  if steps_per_epoch:
    epoch = min(at // steps_per_epoch + 1, -(-total // steps_per_epoch))
    bar.set_description(f"epoch {epoch}/{-(-total // steps_per_epoch)}", refresh=False)
