r"""``jaxtl pretrain | finetune | study --config=RECIPE --workdir=DIR``.

Overrides: ``--config.optim.lr=3e-4``, ``--config=configs/X.py:model=bert_mini``.
Multi-process runs (GPU clusters, TPU pods) call ``jax.distributed.initialize``
first; see ``launch/``.

The console is quiet: the config goes to ``WORKDIR/config.txt``, and it
shows jaxtl's own INFO lines (the step, the loss, the ETA) and everyone's
warnings and errors. ``--verbose`` adds the config and the libraries' INFO
logs (TensorFlow's C++ and Python, JAX's backend probing, Orbax, absl).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from jaxtl import train, training
from jaxtl.data import network
from jaxtl.runtime import console
from jaxtl.train import checkpoint, metrics, stopping, storage, workdir

FLAGS = flags.FLAGS
# sysexits.h's EX_IOERR: a checkpoint could not be written (the log says
# where and why); the same command resumes from the last one written.
EXIT_SAVE_FAILED = 74
config_flags.DEFINE_config_file("config", None, "A recipe's name (jaxtl recipes) or a "
                                "config file, optionally with :ARGS.", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and caches go here.")
flags.DEFINE_enum("mode", "pretrain", list(training.MODES),
                  "What to run (set by jaxtl pretrain | finetune | study).")
flags.DEFINE_bool("multiprocess", False, "Call jax.distributed.initialize() "
                  "(set automatically on SLURM / TPU pods by the launch scripts).")
# Where the cluster environment (SLURM, Cloud TPU, MPI) cannot tell JAX, e.g.
# hosts started by hand: all three, the same coordinator on every process.
flags.DEFINE_string("coordinator_address", None, "host:port of process 0's "
                    "coordinator (with --multiprocess; default: auto-detected).")
flags.DEFINE_integer("num_processes", None, "Processes in the run (default: auto).")
flags.DEFINE_integer("process_id", None, "This process's index (default: auto).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # From here on, SIGTERM and Ctrl-C ask the run to save and stop (a
  # KeyboardInterrupt inside a compile could crash the process).
  stopping.install()

  if FLAGS.multiprocess:
    jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                               num_processes=FLAGS.num_processes,
                               process_id=FLAGS.process_id)

  logging.info("JAX %s on %d %s device(s), process %d of %d", jax.__version__,
               jax.device_count(), jax.devices()[0].platform,
               jax.process_index(), jax.process_count())
  try:
    args = [a for a in sys.argv[1:] if not a.startswith("--mode=")]
    result = training.run(FLAGS.mode, FLAGS.config, FLAGS.workdir, verbose=FLAGS.verbose,
                          command=shlex.join(["jaxtl", FLAGS.mode, *args]))
    _report(result)
  except train.Preempted as e:  # a clean stop: the same command resumes
    logging.warning("%s", e)
    sys.exit(e.exit_code)
  except (workdir.WorkdirConflict, checkpoint.CheckpointMismatch) as e:
    console.fail(e)  # another run's workdir, or other settings: a mistake
  except (checkpoint.UnreadableCheckpoints, workdir.WorkdirBusy,
          network.DataUnavailable) as e:  # not the user's doing; the message says it all
    logging.error("%s", e)
    sys.exit(1)
  except storage.SaveFailed as e:  # a full or read-only disk
    logging.error("%s", e)
    logging.flush()
    sys.stderr.flush()
    # Not sys.exit: Orbax's save threads may wait minutes (its coordination
    # timeout) for a directory that was never made, and the interpreter
    # would wait for them. Everything else was closed by the loop.
    os._exit(EXIT_SAVE_FAILED)  # pylint: disable=protected-access


def _report(result: dict[str, Any]) -> None:
  """The run's last line: what it ended with."""
  if FLAGS.mode == "study":
    logging.info("wrote %s/transfer.md and transfer.png", FLAGS.workdir)
  elif FLAGS.mode == "finetune":
    best, test = result["best_dev"], result["test"]
    logging.info("best dev %s; test %s", "- (no dev split: the last epoch)"
                 if best is None else f"{best:.4g}",
                 "- (no test split)" if test is None else metrics.brief(test))
  else:
    logging.info("final eval: %s", metrics.brief(result))
