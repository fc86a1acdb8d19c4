"""Every command of ``jaxtl``, one module each, started one way by
:func:`jaxtl.programs.cli.start`: flags defined at module level, a
``main(argv)``, no work of their own beyond reading flags and calling the
library. Nothing in the library imports a program."""
