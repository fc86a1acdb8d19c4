"""Training: the one loop, the pure train step, optimizers, sharding, checkpoints.

The names most callers need are here; the modules hold the rest:
:mod:`~jaxtl.train.step` (state init and the jitted step),
:mod:`~jaxtl.train.loop` (the loop, its :class:`Workload` and its
:class:`Stage` s),
:mod:`~jaxtl.train.optim`,
:mod:`~jaxtl.train.sharding`, :mod:`~jaxtl.train.checkpoint`,
:mod:`~jaxtl.train.metrics`, :mod:`~jaxtl.train.perf`.
"""

from jaxtl.train.loop import run
from jaxtl.train.workload import ConfigError, LoopConfig, Outcome, Stage, Workload
from jaxtl.train.metrics import MetricsWriter
from jaxtl.train.stopping import EXIT_PREEMPTED, Preempted
from jaxtl.train.step import (TrainState, abstract_sharded_state, abstract_state,
                              create_sharded_state, eval_step, evaluate,
                              jit_train_step, lm_init_inputs, train_step)

__all__ = ["ConfigError", "EXIT_PREEMPTED", "LoopConfig", "MetricsWriter", "Outcome", "Preempted", "Stage",
           "TrainState", "Workload", "abstract_sharded_state", "abstract_state",
           "create_sharded_state", "eval_step", "evaluate", "jit_train_step",
           "lm_init_inputs", "run", "train_step"]
