"""Restart an entry point with glibc's malloc keeping the memory it frees.

XLA:CPU allocates a step's temporaries as one block at every execution (162
MiB for a MiniLM fine-tuning step at 32 x 16, 786 MiB for BERT-base at 4 x
128) and frees it when the step ends. glibc maps a block that large straight
from the kernel and unmaps it on free; from XLA's worker threads it does so
whatever its mmap settings, since their arenas cannot hold such a block. So
each step faulted its temporaries in afresh, 4 KiB at a time: 40,000 page
faults a MiniLM step, a fifth of the process's CPU time in the kernel.
Three tunables keep the memory instead: one arena for every thread
(``arena_max=1``, so XLA's blocks come from the main heap), no mmap for large
blocks (``mmap_max=0``), and a heap top that is never given back
(``trim_threshold``). A MiniLM fine-tune on 9,000 SST-2 sentences then
spent 4.6 s in the kernel instead of 30, and its epoch took 54 s instead
of 67 (docs/studies/performance.md).

The price is memory: the process keeps its peak heap until it exits, and
blocks of different sizes fragment it. That fine-tune peaked at 2.6 GiB
resident instead of 1.9. Until 2026-11-28 the entry points restarted onto
huge pages (``glibc.malloc.hugetlb=1``) instead: they cut the faults but
not the zeroing of fresh pages, and in runs of several step lengths they
made the longer steps 2-2.5x slower.

Tunables are read only when a process starts, so the command-line entry
points re-execute themselves once with them set; importing jaxtl as a
library never does. ``JAXTL_KEEP_MEMORY=0`` turns the restart off, as does
any of the three tunables already in ``GLIBC_TUNABLES`` (the user's own
choice).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

TUNABLES = {
    "glibc.malloc.arena_max": 1,
    "glibc.malloc.mmap_max": 0,
    "glibc.malloc.trim_threshold": 1 << 40,
}
# The first glibc with GLIBC_TUNABLES.
MIN_GLIBC = (2, 26)
OPT_OUT = "JAXTL_KEEP_MEMORY"


def tunables_keeping_memory(environ: Mapping[str, str],
                            libc: tuple[str, str]) -> str | None:
  """The ``GLIBC_TUNABLES`` value to restart with, or None where there is
  no restart: opted out, any of :data:`TUNABLES` already set (by the user,
  or by the restart itself), or no glibc that reads tunables."""
  current = environ.get("GLIBC_TUNABLES", "")
  if environ.get(OPT_OUT) == "0" or any(name in current for name in TUNABLES):
    return None
  name, version = libc
  try:
    numbers = tuple(int(part) for part in version.split(".")[:2])
  except ValueError:
    return None
  if name != "glibc" or numbers < MIN_GLIBC:
    return None
  ours = [f"{name}={value}" for name, value in TUNABLES.items()]
  return ":".join(filter(None, [current, *ours]))


def restart_keeping_memory() -> None:
  """Re-executes this process (same interpreter, arguments and PID) with
  :data:`TUNABLES` set, where they apply; returns where they do not.

  Call it first thing in a ``__main__`` block: the restarted process runs
  the same command line again from the start.
  """
  if sys.platform != "linux":
    return
  value = tunables_keeping_memory(os.environ, platform.libc_ver())
  if value is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": value})


def describe() -> str:
  """Whether this process's malloc keeps freed memory, for benchmark headings."""
  current = os.environ.get("GLIBC_TUNABLES", "")
  if all(f"{name}={value}" in current for name, value in TUNABLES.items()):
    return "malloc keeps freed memory (glibc tunables)"
  return "malloc: the system's defaults"
