"""``python -m jaxtl COMMAND``: the ``jaxtl`` command, for an environment
whose scripts folder is not on PATH."""

from jaxtl.programs import cli

cli.run()
