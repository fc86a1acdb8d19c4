"""Restart an entry point with glibc's malloc on transparent huge pages.

XLA:CPU allocates a step's temporaries with malloc afresh at every
execution, and the pages behind them come new from the kernel each time. On
a Linux host whose transparent huge pages are in ``madvise`` mode (the
common default) they are faulted in 4 KiB at a time: about 195,000 page
faults per MiniLM fine-tuning step on a CPU, a quarter of the process's CPU
time spent in the kernel. glibc's ``glibc.malloc.hugetlb=1`` tunable makes
malloc ask for huge pages, which cuts the faults 300-fold and the step by a
quarter or more (docs/studies/performance.md). Tunables are read
only when a process starts, so the command-line entry points re-execute
themselves once with it set; importing jaxtl as a library never does.

``JAXTL_HUGE_PAGES=0`` turns the restart off, and ``jaxtl finetune`` and
``jaxtl predict`` do not restart: their batches are cut to several
lengths, and with huge pages the longer lengths' steps ran 2-2.5x slower
than without (MiniLM on a 2-core Zen 4 EPYC, TREC-6: 1,074-1,106 ms against
440-451 ms at 32 x 48, while the 32 x 16 steps were 10-15% faster); a whole
fine-tuning run took 51.6 and 52.7 s with them against 47.4 and 49.3 s
without, and predicting 9,000 sentences 25.4 and 24.1 s against 22.0 and
22.0 s. Steps of one shape (the benchmark's, where they were measured to
pay) keep them.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
# The first glibc that reads glibc.malloc.hugetlb.
MIN_GLIBC = (2, 35)


def thp_mode(path: str = THP_MODE_FILE) -> str:
  """The kernel's transparent-huge-page mode (``always``, ``madvise``,
  ``never``), or "" where it cannot be read."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return ""
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else ""


def tunables_with_huge_pages(environ: Mapping[str, str], mode: str,
                             libc: tuple[str, str]) -> str | None:
  """The ``GLIBC_TUNABLES`` value to restart with, or None where a restart
  would change nothing: opted out, already set, huge pages already used for
  every mapping (``always``) or for none (``never``), or no glibc that knows
  the tunable."""
  current = environ.get("GLIBC_TUNABLES", "")
  if environ.get("JAXTL_HUGE_PAGES") == "0" or TUNABLE in current:
    return None
  if mode != "madvise":
    return None
  name, version = libc
  try:
    numbers = tuple(int(part) for part in version.split(".")[:2])
  except ValueError:
    return None
  if name != "glibc" or numbers < MIN_GLIBC:
    return None
  return ":".join(filter(None, [current, f"{TUNABLE}=1"]))


def restart_with_huge_pages() -> None:
  """Re-executes this process (same interpreter, arguments and PID) with the
  huge-page tunable set, where that helps; returns where it does not.

  Call it first thing in a ``__main__`` block: the restarted process runs
  the same command line again from the start.
  """
  if sys.platform != "linux":
    return
  value = tunables_with_huge_pages(os.environ, thp_mode(), platform.libc_ver())
  if value is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": value})


def describe() -> str:
  """Whether this process's malloc gets huge pages, for benchmark headings."""
  mode = thp_mode()
  if mode == "always":
    return "huge pages: always (kernel)"
  if mode == "madvise" and f"{TUNABLE}=1" in os.environ.get("GLIBC_TUNABLES", ""):
    return "huge pages: malloc (glibc tunable)"
  return f"huge pages: not for malloc (kernel: {mode or 'unknown'})"
