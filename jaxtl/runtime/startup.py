"""What a command-line entry point does first: tune the process for its
CPU, and keep compiled programs between runs.

The CPU half must happen before JAX starts: XLA reads ``XLA_FLAGS`` when it
creates its CPU client, and glibc reads its tunables only when a process
starts (so the malloc half re-executes the process, which inherits the
flags). Importing jaxtl as a library does none of this; a program that
wants it calls :func:`tune_process` first thing.
"""

from jaxtl.runtime import compile_cache, malloc, xla_cpu


def tune_process(compilation_cache: bool = True) -> None:
  """XLA:CPU flags for this CPU (:mod:`jaxtl.runtime.xla_cpu`); the restart
  with a malloc that keeps the memory it frees, and CPU programs run on the
  calling thread (:mod:`jaxtl.runtime.malloc`); then the persistent
  compilation cache (:mod:`jaxtl.runtime.compile_cache`) unless
  ``compilation_cache`` is False (the benchmark, whose compile times are
  those of a cold start)."""
  xla_cpu.apply()
  malloc.restart_keeping_memory()
  malloc.dispatch_inline()
  if compilation_cache:
    compile_cache.enable()
