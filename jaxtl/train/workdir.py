"""One owner per workdir: a lock that a second run on the same workdir meets.

Two processes training into one workdir interleave their metrics and race
on the same checkpoint steps (one dies in Orbax's temporary directories, the
other owns a mixed history). :func:`owned` takes an exclusive ``flock`` on
``WORKDIR/.lock`` and writes the holder (pid, host, start time) into it; a
second run fails at once with that holder in the message. The kernel drops
the lock when its process exits, however it exits (kill -9 included), so a
stale lock never blocks a restart and there is nothing to clean up. On a
multi-process run, process 0 holds it for all.

Taking the lock also proves the workdir and its checkpoint folders
writable before any work starts (a real write: a full or read-only disk
fails now, naming the folder, not at the first save). A workdir the run
made that holds nothing but the lock when the run fails is removed: a
mistaken command leaves no empty folder behind.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
from collections.abc import Iterator

from jaxtl import layout
from jaxtl.train.storage import file_in_the_way, probe_writable

_held: dict[str, list[int]] = {}  # realpath -> [fd, depth]: re-entrant per process


class WorkdirBusy(RuntimeError):
  """Another live process holds the workdir."""


class WorkdirConflict(RuntimeError):
  """The workdir holds a run that this one cannot continue."""


def holds_checkpoints(path: str) -> bool:
  """Whether a run has saved anything into ``path`` (checkpoints or best/)."""
  return any(os.path.isdir(d) and os.listdir(d)
             for d in (layout.checkpoints(path), layout.best(path)))


def _check_writable(path: str) -> None:
  """Fails now (:class:`jaxtl.train.storage.SaveFailed`), naming the
  folder and the OS error, where a save would fail much later; a file
  where the workdir should be is the user's mistake (NotADirectoryError)."""
  if (file := file_in_the_way(path)) is not None:
    what = "" if file == path else f" cannot be made: {file}"
    raise NotADirectoryError(f"--workdir {path}{what} is a file, not a folder; pass "
                             "another --workdir")
  probe_writable(path, "the run's checkpoints and metrics cannot be saved there")
  for d in (layout.checkpoints(path), layout.best(path)):
    if os.path.isdir(d):
      probe_writable(d, "checkpoints cannot be saved there")


@contextlib.contextmanager
def owned(workdir: str, *, enabled: bool = True) -> Iterator[None]:
  """Holds ``workdir`` (created if missing) for the duration; re-entrant.

  Raises :class:`WorkdirBusy` when another process holds it, and
  :class:`jaxtl.train.storage.SaveFailed` when it (or its checkpoints)
  cannot be written.
  """
  path = os.path.realpath(workdir)
  if not enabled or path in _held:
    if path in _held:
      _held[path][1] += 1
    try:
      yield
    finally:
      if path in _held:
        _held[path][1] -= 1
    return
  created = not os.path.exists(path)
  _check_writable(path)  # creates it
  fd = os.open(layout.lock_file(path), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = os.read(fd, 4096).decode("utf-8", "replace").strip()
    os.close(fd)
    if e.errno not in (errno.EAGAIN, errno.EACCES):
      raise
    raise WorkdirBusy(
        f"workdir {path} is in use by another run ({holder or 'holder unknown'}); "
        "wait for it to finish or stop it, or pass another --workdir. (The lock "
        "goes with its process, so a run that died does not hold it.)") from None
  started = datetime.datetime.now().isoformat(timespec="seconds")
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}\n"
            .encode(), 0)
  _held[path] = [fd, 1]
  try:
    yield
  except BaseException:
    if created and os.listdir(path) == [layout.LOCK_FILE]:
      # A run that failed at its start leaves no empty workdir behind.
      os.remove(layout.lock_file(path))
      os.rmdir(path)
    raise
  finally:
    _held[path][1] -= 1
    if _held[path][1] == 0:
      del _held[path]
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)
