"""What every entry point prints: jaxtl's own progress, everyone's warnings.

The libraries under jaxtl (TensorFlow for TFDS, XLA, Orbax, absl) log
dozens of INFO lines per run; a user watching a run wants the step, the
loss and the ETA. ``--verbose`` (a flag of every entry point that calls
:func:`quiet_libraries`) brings the libraries' INFO lines back.
"""

from __future__ import annotations

import logging as py_logging
import os
import sys

from absl import flags
from absl import logging

JAXTL_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

flags.DEFINE_bool("verbose", False, "Also print the libraries' INFO logs "
                  "(TensorFlow, JAX, Orbax, absl) and, for runs, the config.")


class _OwnInfoOnly(py_logging.Filter):
  """Keeps warnings and errors, and INFO only from jaxtl's own code.

  Filtered by the calling file, not the logger name: jaxtl, Orbax and TFDS
  all log through absl's or the root logger.
  """

  def filter(self, record: py_logging.LogRecord) -> bool:
    return (record.levelno >= py_logging.WARNING
            or os.path.abspath(record.pathname).startswith(JAXTL_DIR))


def _wants_verbose(argv: list[str]) -> bool:
  """``--verbose`` as absl will parse it, read before absl parses."""
  early = flags.FlagValues()
  flags.DEFINE_bool("verbose", False, "", flag_values=early)
  try:
    early(argv, known_only=True)
  except flags.Error:
    return False  # absl's own parse reports it
  return early.verbose


def set_log_environment(argv: list[str]) -> None:
  """What TensorFlow's and XLA's C++ logging read from the environment when
  they load: set before flags are parsed, since loading a config file
  imports JAX already. Values the user set win.
  """
  verbose = _wants_verbose(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "1")
  # TensorFlow only reads TFDS records here, so its oneDNN kernels never
  # run, and its "oneDNN custom operations are on" INFO line ignores
  # TF_CPP_MIN_LOG_LEVEL.
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  if not verbose and not sys.stderr.isatty():
    # TFDS's download/prepare bars are carriage-return noise in a log file.
    # (jaxtl's own bars say ``disable`` and are not affected.)
    os.environ.setdefault("TQDM_DISABLE", "1")


def quiet_libraries(argv: list[str]) -> bool:
  """Call first in ``__main__``: sets the logging environment and, unless
  ``--verbose`` is in ``argv``, keeps only jaxtl's INFO lines on the
  console. Returns whether verbose."""
  set_log_environment(argv)
  verbose = _wants_verbose(argv)
  if not verbose:
    logging.get_absl_handler().addFilter(_OwnInfoOnly())
  return verbose
