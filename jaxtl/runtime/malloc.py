"""Restart an entry point with glibc's malloc keeping the memory it frees,
and run CPU programs on the thread that calls them.

XLA:CPU allocates a step's temporaries as one block at every execution (155
MiB for a MiniLM fine-tuning step at 32 x 16) and frees it when the step
ends. glibc maps a block that large straight from the kernel and unmaps it
on free, so each step faulted its temporaries in afresh, 4 KiB at a time:
40,000 page faults a MiniLM step, a fifth of the process's CPU time in the
kernel. Two tunables keep the memory instead: no mmap for large blocks
(``mmap_max=0``) and a heap top that is never given back
(``trim_threshold``). They reach only the main thread's heap: a block this
large from any other thread is mapped whatever the tunables say, and JAX
runs a CPU program on a worker thread unless its asynchronous dispatch is
off. :func:`dispatch_inline` turns it off (a program over several devices
keeps its threads). A MiniLM fine-tune on 9,000 SST-2 sentences then spent
5-7 s in the kernel instead of 30-32, and its epoch took 59-60 s instead of
69-72; its peak resident memory rose from 2.0 to 2.3 GiB, since the heap
keeps its largest size (docs/studies/performance.md).

Until 2026-11-28 the entry points restarted onto huge pages
(``glibc.malloc.hugetlb=1``) instead: they cut the faults but not the
zeroing of fresh pages, and in runs of several step lengths they made the
longer steps 2-2.5x slower. Putting every thread on the main heap
(``arena_max=1``) kept the memory too, but doubled the time multithreaded
SentencePiece training took and fragmented the heap.

Tunables are read only when a process starts, so the command-line entry
points re-execute themselves once with them set; importing jaxtl as a
library never does. ``JAXTL_KEEP_MEMORY=0`` turns both halves off; either
tunable already in ``GLIBC_TUNABLES`` (the user's own choice) leaves the
restart out.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

TUNABLES = {
    "glibc.malloc.mmap_max": 0,
    "glibc.malloc.trim_threshold": 1 << 40,
}
# The first glibc with GLIBC_TUNABLES.
MIN_GLIBC = (2, 26)
OPT_OUT = "JAXTL_KEEP_MEMORY"


def _settings() -> list[str]:
  """:data:`TUNABLES` as ``GLIBC_TUNABLES`` writes them."""
  return [f"{name}={value}" for name, value in TUNABLES.items()]


def _opted_out(environ: Mapping[str, str]) -> bool:
  return environ.get(OPT_OUT) == "0"


def tunables_keeping_memory(environ: Mapping[str, str],
                            libc: tuple[str, str]) -> str | None:
  """The ``GLIBC_TUNABLES`` value to restart with, or None where there is
  no restart: opted out, any of :data:`TUNABLES` already set (by the user,
  or by the restart itself), or no glibc that reads tunables."""
  current = environ.get("GLIBC_TUNABLES", "")
  if _opted_out(environ) or any(name in current for name in TUNABLES):
    return None
  kind, version = libc
  try:
    numbers = tuple(int(part) for part in version.split(".")[:2])
  except ValueError:
    return None
  if kind != "glibc" or numbers < MIN_GLIBC:
    return None
  return ":".join(filter(None, [current, *_settings()]))


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


def dispatch_inline(environ: Mapping[str, str] = os.environ) -> None:
  """Runs single-device CPU programs on the calling thread (JAX's
  ``jax_cpu_enable_async_dispatch`` off), so that their temporaries come
  from the heap the tunables keep; unless opted out. Call it before JAX
  starts its backend. On a CPU the loop gains nothing from queueing a step
  behind the running one (docs/studies/performance.md)."""
  if _opted_out(environ):
    return
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_cpu_enable_async_dispatch", False)


def describe() -> str:
  """Whether this process's malloc keeps freed memory, for benchmark headings."""
  current = os.environ.get("GLIBC_TUNABLES", "")
  if all(setting in current for setting in _settings()):
    return "malloc keeps freed memory (glibc tunables)"
  return "malloc: the system's defaults"
