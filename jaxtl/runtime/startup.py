"""What a command-line entry point does first: tune the process for its
CPU, and keep compiled programs between runs.

The CPU half must happen before JAX starts: XLA reads ``XLA_FLAGS`` when it
creates its CPU client, and glibc reads its tunables only when a process
starts (so the huge-page half re-executes the process, which inherits the
flags). Importing jaxtl as a library does none of this; a program that
wants it calls :func:`tune_process` first thing.
"""

from jaxtl.runtime import compile_cache, hugepages, xla_cpu


def tune_process(compilation_cache: bool = True, huge_pages: bool = True) -> None:
  """XLA:CPU flags for this CPU (:mod:`jaxtl.runtime.xla_cpu`), the restart onto
  huge pages where it helps (:mod:`jaxtl.runtime.hugepages`) unless
  ``huge_pages`` is False (fine-tuning and prediction: see there), then the
  persistent compilation cache (:mod:`jaxtl.runtime.compile_cache`) unless
  ``compilation_cache`` is False (the benchmark, whose compile times are
  those of a cold start)."""
  xla_cpu.apply()
  if huge_pages:
    hugepages.restart_with_huge_pages()
  if compilation_cache:
    compile_cache.enable()
