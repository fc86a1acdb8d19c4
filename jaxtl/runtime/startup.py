"""What a command-line entry point does first: keep the memory XLA:CPU
frees, and keep compiled programs between runs.

The malloc half must happen before JAX starts: glibc reads its tunables
only when a process starts, so it re-executes the process. Importing jaxtl
as a library does none of this; a program that wants it calls
:func:`tune_process` first thing.
"""

from jaxtl.runtime import compile_cache, malloc


def tune_process(compilation_cache: bool = True) -> None:
  """The restart with a malloc that keeps the memory it frees, and CPU
  programs run on the calling thread (:mod:`jaxtl.runtime.malloc`); then
  the persistent compilation cache (:mod:`jaxtl.runtime.compile_cache`)
  unless ``compilation_cache`` is False (the benchmark, whose compile times
  are those of a cold start)."""
  malloc.restart_keeping_memory()
  malloc.dispatch_inline()
  if compilation_cache:
    compile_cache.enable()
