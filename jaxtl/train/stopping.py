"""Stop requests: SIGTERM (a job system's preemption) and SIGINT (Ctrl-C)
become a flag the training loop reads between steps, so a run stops at a
point it can save and resume from, never in the middle of a step or a save.

Python's own Ctrl-C raises ``KeyboardInterrupt`` wherever the main thread
is. Inside a compile or a save that unwinds through C++ code still running
on XLA's or Orbax's threads, and the process then dies in its teardown
(rc 139, nothing saved). Here the handler only records the request; the
loop saves a checkpoint and raises :class:`Preempted`. A second Ctrl-C
quits at once, without saving, for a user who will not wait.

``jaxtl pretrain`` installs the handlers for its whole life
(:func:`install`), so a request during set-up (tokenizer training, data
reading, the first compile) or during the final test evaluation is kept
too; the loop installs them for its own span when used as a library.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

from jaxtl.runtime.console import EXIT_INTERRUPTED  # the shell's code for a Ctrl-C

# sysexits.h's EX_TEMPFAIL, "a temporary failure; the user is invited to
# retry": the same command resumes. launch/slurm.sbatch requeues on it.
EXIT_PREEMPTED = 75

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_requested: list[int] = []  # the signals received, in order
_installed: list[dict[int, object]] = []  # a stack of the handlers replaced


class Preempted(RuntimeError):
  """Training stopped early on SIGTERM or SIGINT, after saving a checkpoint.

  ``jaxtl pretrain`` then exits with :attr:`exit_code`
  (:data:`EXIT_PREEMPTED` for SIGTERM, :data:`EXIT_INTERRUPTED` for
  Ctrl-C), so that a shell chain (``&&``) or a job system does not take the
  run as finished.
  """

  def __init__(self, message: str, signum: int = signal.SIGTERM):
    super().__init__(message)
    self.exit_code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED


def requested() -> int | None:
  """The first stop signal received (None: none)."""
  return _requested[0] if _requested else None


def name(signum: int) -> str:
  return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _handle(signum: int, frame: object) -> None:  # pylint: disable=unused-argument
  if signum == signal.SIGINT and signal.SIGINT in _requested:
    sys.stderr.write("\nsecond Ctrl-C: quitting now, without saving\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)  # pylint: disable=protected-access
  _requested.append(signum)
  if len(_requested) == 1:
    logging.warning("%s received: saving a checkpoint at the end of this step, then "
                    "stopping%s", name(signum),
                    " (Ctrl-C again quits at once, without saving)"
                    if signum == signal.SIGINT else "")


def install() -> None:
  """Turns SIGTERM and SIGINT into stop requests until :func:`uninstall`
  (main thread only; elsewhere a no-op). Nested calls stack."""
  if threading.current_thread() is not threading.main_thread():
    _installed.append({})
    return
  _installed.append({s: signal.signal(s, _handle) for s in _SIGNALS})


def uninstall() -> None:
  """Puts back the handlers the matching :func:`install` replaced; the
  outermost one also forgets the requests received."""
  for signum, previous in _installed.pop().items():
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)
  if not _installed:
    _requested.clear()


class Interrupted(Exception):
  """Raised by :func:`check` inside long work that a stop request cuts
  short (the final test evaluation); the loop saves and stops."""


def check() -> None:
  """Raises :class:`Interrupted` when a stop was requested."""
  if _requested:
    raise Interrupted(f"stopped by {name(_requested[0])}")


@contextlib.contextmanager
def handled() -> Iterator[None]:
  """:func:`install` for the span of a ``with`` block."""
  install()
  try:
    yield
  finally:
    uninstall()
