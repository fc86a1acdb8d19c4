"""Whether checkpoints can be written: a probe write, free space, and the
error that names the folder when they cannot.

A save that fails deep inside Orbax surfaces late and badly (one save later,
as a TensorStore error, or as a 300 s wait on Orbax's threads); these checks
make the common failures -- a full or read-only disk, lost permissions, a
folder that became a file -- fail first, in the caller's thread, in words.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import jax
import numpy as np


class SaveFailed(RuntimeError):
  """A checkpoint cannot be written (disk full or read-only, permissions);
  the message names the folder and the OS error."""


PROBE_BYTES = 4096  # a block: a full disk refuses it where an empty file fits


def probe_writable(directory: str, why: str = "checkpoints cannot be saved there") -> None:
  """Creates ``directory`` if needed, writes, syncs and removes a small file
  in it; raises :class:`SaveFailed` naming the folder and the OS error.

  A real write, not ``os.access``: that says yes to root on a read-only
  filesystem and knows nothing of a full disk.
  """
  error = write_error(directory)
  if error is None:
    return
  if (file := file_in_the_way(directory)) is not None:
    raise SaveFailed(f"{file} is a file, not a folder: {why}; pass another "
                     "--workdir") from error
  raise SaveFailed(f"{directory} is not writable ({describe(error)}): {why}; free "
                   "space or fix its permissions, or pass another --workdir") from error


def write_error(directory: str) -> OSError | None:
  """The OS error a small write into ``directory`` meets (None: it works).

  Also what a failed save is explained by: TensorStore reports a disk made
  read-only under it as ``PERMISSION_DENIED`` in a ValueError, the OS says
  ``EROFS``."""
  probe = os.path.join(directory, f".jaxtl-write-probe.{socket.gethostname()}.{os.getpid()}")
  try:
    os.makedirs(directory, exist_ok=True)
    with open(probe, "wb") as f:
      f.write(b"\0" * PROBE_BYTES)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    return e
  finally:
    try:
      os.remove(probe)
    except OSError:
      pass
  return None


def file_in_the_way(directory: str) -> str | None:
  """``directory``, or the nearest folder above it, where that exists as a
  file (or anything but a folder); None where nothing is in the way."""
  path = os.path.abspath(directory)
  while not os.path.lexists(path):
    parent = os.path.dirname(path)
    if parent == path:
      return None
    path = parent
  return None if os.path.isdir(path) else path


def describe(e: OSError) -> str:
  """``ENOSPC: No space left on device``: the errno's name and its text."""
  name = errno.errorcode.get(e.errno or 0)
  return f"{name}: {e.strerror}" if name and e.strerror else str(e)


def check_space(directory: str, needed_bytes: int) -> None:
  """Fails before training when the filesystem of ``directory`` has less
  free space than one checkpoint of ``needed_bytes`` (an old checkpoint is
  only deleted after the new one is written)."""
  try:
    stat = os.statvfs(directory)
  except OSError:
    return  # nothing to say: the probe names what is wrong with the folder
  if not stat.f_blocks:
    return  # reports no size (many FUSE and network filesystems): no figure to trust
  free = stat.f_bavail * stat.f_frsize
  if free < needed_bytes:
    raise SaveFailed(f"{directory} has {free / 2**20:.1f} MiB free, but a checkpoint "
                     f"of this run takes about {needed_bytes / 2**20:.1f} MiB: no save "
                     "would succeed; free space or pass another --workdir")


def state_bytes(tree: Any) -> int:
  """Bytes of the arrays in ``tree`` (abstract or not): a checkpoint's size."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))
