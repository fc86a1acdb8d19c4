"""Whether a download can work at all, asked in seconds rather than minutes.

TFDS and Hugging Face `datasets` both retry a failed download with growing
back-off (3.5 minutes for TFDS's tiny_shakespeare, 23 s for a Hub name on a
machine without DNS), then fail with a long traceback that does not say how
to point them at local files. One TCP connection with a short timeout tells
the same thing at once, so the readers ask it before they download and fail
with a message of their own.
"""

from __future__ import annotations

import socket
import urllib.parse

# Where jaxtl's recipes find the shared local datasets; the messages for
# missing data name it (jaxtl.data.sources reads it).
DATA_DIR_ENV = "JAXTL_DATA_DIR"

PROBE_TIMEOUT_S = 3.0


class DataUnavailable(ConnectionError):
  """A dataset is neither at hand nor downloadable. The message is whole
  (which dataset, where it looked, how to point it at local files), so the
  command line prints it without a traceback."""


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
  """None when ``url``'s host accepts a TCP connection within ``timeout``
  seconds; otherwise a short reason ("no network: cannot reach HOST: ...")."""
  parsed = urllib.parse.urlsplit(url if "//" in url else f"https://{url}")
  host = parsed.hostname or url
  port = parsed.port or (80 if parsed.scheme == "http" else 443)
  try:
    with socket.create_connection((host, port), timeout=timeout):
      return None
  except OSError as e:  # DNS failure, refused, unreachable, timeout.
    return f"no network: cannot reach {host}:{port} ({e})"
