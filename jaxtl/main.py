r"""Entry point: ``python -m jaxtl.main --config=configs/X.py --workdir=DIR``.

Overrides: ``--config.optim.lr=3e-4``, ``--config=configs/X.py:model=bert_mini``.
Multi-process runs (GPU clusters, TPU pods) call ``jax.distributed.initialize``
first; see ``launch/``.
"""

from __future__ import annotations

import logging as py_logging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from jaxtl import cli, hugepages

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and caches go here.")
flags.DEFINE_enum("mode", "pretrain", ["pretrain", "finetune", "study"],
                  "pretrain: configs/pretrain_*.py; finetune: configs/finetune.py; "
                  "study: configs/transfer_study.py.")
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
  import jax  # pylint: disable=g-import-not-at-top

  if FLAGS.multiprocess:
    jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                               num_processes=FLAGS.num_processes,
                               process_id=FLAGS.process_id)
  from jaxtl import train  # pylint: disable=g-import-not-at-top

  logging.info("JAX %s on %d %s device(s), process %d of %d", jax.__version__,
               jax.device_count(), jax.devices()[0].platform,
               jax.process_index(), jax.process_count())
  logging.info("config:\n%s", FLAGS.config)
  try:
    _run_mode()
  except train.Preempted as e:  # a clean stop: the same command resumes
    logging.warning("%s", e)


def _run_mode() -> None:
  from jaxtl.tasks import finetune  # pylint: disable=g-import-not-at-top
  from jaxtl import train
  from jaxtl.tools import transfer_study
  if FLAGS.mode == "study":
    transfer_study.run_study(FLAGS.config, FLAGS.workdir)
    logging.info("wrote %s/transfer.md and transfer.png", FLAGS.workdir)
  elif FLAGS.mode == "finetune":
    results = finetune.finetune_and_evaluate(FLAGS.config, FLAGS.workdir)
    best = results["best_dev"]
    logging.info("best dev %s; test %s", "- (none held out: the last epoch)"
                 if best is None else best, results["test"])
  else:
    metrics = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    logging.info("final eval: %s", metrics)


class _QuietLibraries(py_logging.Filter):
  """Drops INFO chatter from Orbax (dozens of lines per checkpoint)."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    return record.levelno > py_logging.INFO or "orbax" not in record.pathname


if __name__ == "__main__":
  hugepages.restart_with_huge_pages()
  sys.argv = cli.with_recipe_paths(sys.argv)
  logging.get_absl_handler().addFilter(_QuietLibraries())
  app.run(main)
