"""``--compute_dtype``, one flag with one meaning for the commands that run a
saved model (``predict``, ``generate``, ``prompt``, ``analysis``)."""

from __future__ import annotations

from absl import flags


def define_compute_dtype(module_name: str, unset: str) -> None:
  """Defines ``--compute_dtype`` as a flag of the program ``module_name``
  (so that its ``--help`` lists it); ``unset`` says what the command
  computes in when it is not given (the flag is then "")."""
  flags.DEFINE_enum(
      "compute_dtype", "", ["", "auto", "float32", "bfloat16"],
      f"What the model computes in (default: {unset}). auto: bfloat16 on GPUs, "
      "TPUs and CPUs whose bf16 matmuls are twice float32's, float32 on other CPUs.",
      module_name=module_name)
