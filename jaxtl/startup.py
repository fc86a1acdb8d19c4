"""What a command-line entry point does first: tune the process for its CPU.

Both halves must happen before JAX starts: XLA reads ``XLA_FLAGS`` when it
creates its CPU client, and glibc reads its tunables only when a process
starts (so the huge-page half re-executes the process, which inherits the
flags). Importing jaxtl as a library does neither; a program that wants
them calls :func:`tune_process` first thing.
"""

from jaxtl import hugepages, xla_cpu


def tune_process() -> None:
  """XLA:CPU flags for this CPU (:mod:`jaxtl.xla_cpu`), then the restart
  onto huge pages where it helps (:mod:`jaxtl.hugepages`)."""
  xla_cpu.apply()
  hugepages.restart_with_huge_pages()
