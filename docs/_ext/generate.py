"""A Sphinx extension that writes the pages generated from the code.

At ``builder-inited`` it writes, before Sphinx reads any page:

- ``reference/recipes.md``: every shipped recipe and its docstring;
- ``reference/config/<recipe>.md``: every key of the recipe, its type,
  default and meaning (``jaxtl.configs.common.describe``; a key without a
  meaning raises, which fails the build);
- ``reference/cli.md``: ``jaxtl --help`` and every command's own flags, as
  the commands print them;
- ``benchmarks.md`` and its plots: ``launch/benchmark_results.md``.

None of these files is committed (``.gitignore``), so none can drift from
what it describes. A file is rewritten only when its text changes, which
keeps incremental builds incremental.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent import futures
from typing import Any

import benchmarks_page

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)


def write(relpath: str, content: str | bytes) -> None:
  """A page (text) or a figure (bytes) into ``docs/relpath``, unless it
  holds it already."""
  path = os.path.join(DOCS, relpath)
  data = content.encode("utf-8") if isinstance(content, str) else content
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if os.path.exists(path):
    with open(path, "rb") as f:
      if f.read() == data:
        return
  with open(path, "wb") as f:
    f.write(data)


def escaped(text: str) -> str:
  """``text`` with its pipes escaped, for a Markdown table cell."""
  return text.replace("|", "\\|")


def cell(value: Any) -> str:
  """A value as a Markdown table cell: code, with pipes escaped."""
  return f"`{escaped(repr(value))}`"


# ----------------------------------------------------------------------------
# Recipes and their keys.


def recipes_page() -> str:
  from jaxtl import recipes  # pylint: disable=g-import-not-at-top
  lines = ["# Recipes", "",
           "The recipes that ship with jaxtl (`jaxtl recipes` lists them). Give one",
           "to a command by name, `--config=NAME` or `--config=NAME:ARGS`; each",
           "recipe's page lists every key it sets.", ""]
  for name in recipes.names():
    lines += [f"## {name}", "", f"{recipes.summary(name)}. Keys: [{name}](config/{name}.md).",
              "", "```text", recipes.docstring(name).rstrip(), "```", ""]
  return "\n".join(lines)


def config_page(name: str) -> str:
  """One recipe's keys, as a table."""
  from jaxtl import recipes  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import common  # pylint: disable=g-import-not-at-top
  rows = common.describe(recipes.load(os.path.join(recipes.RECIPES_DIR, f"{name}.py")))
  lines = [f"# {name}", "", f"{recipes.summary(name)}.", "",
           f"Every key of `--config={name}` with its default arguments, as "
           f"`jaxtl config {name}` prints them; override any with "
           "`--config.KEY=VALUE`. The recipe itself: [recipes](../recipes.md).", "",
           "| key | type | default | meaning |", "|---|---|---|---|"]
  lines += [f"| `{key}` | {type(value).__name__} | {cell(value)} | {escaped(meaning)} |"
            for key, value, meaning in rows]
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# The command line.


# A command's flags as ``jaxtl COMMAND --helpshort`` would print them, for
# every command: the train commands' own --helpshort answers with their
# recipes, so the program is started the way ``jaxtl`` starts it.
_HELPSHORT = ("import sys; from jaxtl.programs import cli; c = cli.COMMANDS[sys.argv[1]]; "
              "cli.start(c, [f'jaxtl {sys.argv[1]}', *c.preset, '--helpshort'])")


def _flags(command: str) -> str:
  """The flag block of ``jaxtl COMMAND --helpshort``, without absl's footer
  and file headers."""
  out = subprocess.run([sys.executable, "-c", _HELPSHORT, command], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, check=False).stdout
  keep = [line.rstrip() for line in out.splitlines()
          if not line.startswith("Try --helpfull") and not line.rstrip().endswith(".py:")]
  text = "\n".join(keep).strip()
  block = text.split("\nflags:\n", 1)[1] if "\nflags:\n" in text else ""
  return textwrap.dedent(block).strip("\n")


def cli_page() -> str:
  from jaxtl.programs import cli  # pylint: disable=g-import-not-at-top
  # lm_eval takes EleutherAI's flags, said in words below; finetune and
  # study take pretrain's.
  own = [name for name, spec in cli.COMMANDS.items() if spec.module and name != "lm_eval"
         and (name not in cli.MODE_RECIPES or name == "pretrain")]
  with futures.ThreadPoolExecutor(4) as pool:
    flag_blocks = dict(zip(own, pool.map(_flags, own)))
  lines = ["# Command line", "",
           "Every command of `jaxtl`, with the flags it takes, as the commands print",
           "them: `jaxtl COMMAND --helpshort` shows the same (`--help`: with what",
           "the command is for). `python -m jaxtl COMMAND` runs it too.", "",
           "```text", cli.usage(), "```", ""]
  for command, spec in cli.COMMANDS.items():
    lines += [f"## jaxtl {command}", "", f"{spec.summary[0].upper()}{spec.summary[1:]}.", ""]
    if spec.module is None:
      continue
    if command in cli.MODE_RECIPES:
      lines += ["```text", cli.mode_help(command), "```", ""]
      if command != "pretrain":
        lines += ["Flags: those of [jaxtl pretrain](#jaxtl-pretrain).", ""]
        continue
      lines += ["Flags (`pretrain`, `finetune` and `study` share them; the command sets",
                "`--mode`):", ""]
    if command == "lm_eval":
      lines += ["Takes the flags of EleutherAI's `lm_eval` (`lm_eval --help`); jaxtl",
                "sets `--model=jaxtl` and reads `--model_args=checkpoint=WORKDIR`.", ""]
      continue
    if not flag_blocks[command]:
      raise RuntimeError(f"jaxtl {command} --helpshort printed no flags")
    lines += ["```text", flag_blocks[command], "```", ""]
  return "\n".join(lines)


def generate(app: Any = None) -> None:  # pylint: disable=unused-argument
  """Writes every generated page (Sphinx's builder-inited hook)."""
  from jaxtl import recipes  # pylint: disable=g-import-not-at-top
  write("reference/recipes.md", recipes_page())
  for name in recipes.names():
    write(f"reference/config/{name}.md", config_page(name))
  write("reference/cli.md", cli_page())
  page, figures = benchmarks_page.render(os.path.join(ROOT, "launch", "benchmark_results.md"))
  for relpath, data in figures.items():
    write(relpath, data)
  write("benchmarks.md", page)


def setup(app: Any) -> dict[str, Any]:
  app.connect("builder-inited", generate)
  return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
  generate()
