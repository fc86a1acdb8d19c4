"""Keep compiled XLA programs on disk between runs (JAX's persistent
compilation cache).

Compiling the train step is the slowest part of starting a run: 30-35 s for
a 12-layer preset's step on an H100, about 6 s for MiniLM's on a 2-core
CPU. The same program is compiled again by a resumed run, by each run of a
sweep with the same shapes, by every repeat of a recipe (the learning-rate
schedule is an input of the step, so a run with another rate or length
compiles the same program: :class:`jaxtl.train.optim.Schedule`). JAX can
keep the executables on disk, keyed by the program, its devices, the jax and jaxlib
versions and ``XLA_FLAGS``, so such a run loads its step instead of
compiling it, and a changed program or flag can never hit a stale entry.

The command-line entry points turn it on (through
:func:`jaxtl.runtime.startup.tune_process`) in ``$XDG_CACHE_HOME/jaxtl/xla``
(``~/.cache/jaxtl/xla``), bounded to :data:`MAX_BYTES` with
least-recently-used eviction under a file lock, so processes can share it;
importing jaxtl as a library never does. ``JAXTL_COMPILATION_CACHE=DIR``
puts it elsewhere and ``=0`` turns it off; a ``JAX_COMPILATION_CACHE_DIR``
already set is JAX's own setting and is left alone. Programs that compile
in :data:`MIN_COMPILE_SECONDS` or more are kept, not only JAX's 1 s ones
(``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` overrides it).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Mapping

log = logging.getLogger(__name__)

MAX_BYTES = 2 << 30  # executables of a 12-layer step are tens of MB
# Programs that took at least this long to compile are kept (JAX's default
# is 1 s). A fine-tune's train steps take longer anyway; its evaluation
# program, its state's init and the checkpoint fingerprints' dozen small
# programs take 0.05-0.4 s each and load in 0.02-0.08 s: MiniLM on TREC-6,
# 2-core Zen 4 EPYC, 1.4 s less compiling in each later run.
MIN_COMPILE_SECONDS = 0.05


def cache_dir(environ: Mapping[str, str]) -> str | None:
  """The folder to keep compiled programs in, or None to leave JAX's
  setting alone (the user set ``JAX_COMPILATION_CACHE_DIR``, or turned
  jaxtl's off with ``JAXTL_COMPILATION_CACHE=0``)."""
  if "JAX_COMPILATION_CACHE_DIR" in environ:
    return None
  chosen = environ.get("JAXTL_COMPILATION_CACHE", "")
  if chosen == "0":
    return None
  if chosen:
    return os.path.abspath(os.path.expanduser(chosen))
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "jaxtl", "xla")


def enable(environ: Mapping[str, str] = os.environ) -> str | None:
  """Points JAX's persistent compilation cache at :func:`cache_dir`; returns
  the folder, or None where it is left off. A folder that cannot be written
  leaves it off with a warning: a run never fails for want of a cache."""
  folder = cache_dir(environ)
  if folder is None:
    return None
  if importlib.util.find_spec("filelock") is None:  # JAX's bounded cache locks with it
    log.warning("no compilation cache: the filelock package is not installed")
    return None
  try:
    os.makedirs(folder, exist_ok=True)
    writable = os.access(folder, os.W_OK)
  except OSError:
    writable = False
  if not writable:
    log.warning("no compilation cache: %s cannot be written (set "
                "JAXTL_COMPILATION_CACHE=DIR, or =0 to silence this)", folder)
    return None
  # heavy: the CLI imports this module before it tunes the process (XLA flags,
  # malloc restart), which must come before JAX is loaded (startup.py)
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in environ:  # else the user's
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  return folder
