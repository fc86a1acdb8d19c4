"""What a process does before its work: a malloc that keeps freed memory
and the persistent compilation cache (:mod:`~jaxtl.runtime.startup` runs
them in order); the precision ``auto`` picks for this CPU
(:mod:`~jaxtl.runtime.xla_cpu`); and what the console shows
(:mod:`~jaxtl.runtime.console`)."""
