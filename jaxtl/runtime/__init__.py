"""What a process does before its work: XLA:CPU flags for this CPU, a
malloc that keeps freed memory, the persistent compilation cache
(:mod:`~jaxtl.runtime.startup` runs them in order), and what the console
shows (:mod:`~jaxtl.runtime.console`)."""
