"""The package's import graph: no cycles, and the core never imports the
tools, the recipes or the tasks built on it. Every module is in a layer,
``__main__`` files included (a program sits above what it runs)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxtl"
# The layers of the house, bottom up: a module may import its own layer and
# those below it, never one above. docs/architecture.md tables the same.
LAYERS = [
    ("jaxtl.runtime", "jaxtl.layout"),  # process set-up, console, workdir names
    ("jaxtl.models",),                  # Flax modules, configs, families
    ("jaxtl.decoding",),                # KV-cache generation, sampling
    ("jaxtl.data",),                    # sources, tokenizers, rows, batches
    ("jaxtl.objectives",),              # pretraining objectives and losses
    ("jaxtl.convert",),                 # Hugging Face weights in and out
    ("jaxtl.train",),                   # the step, the loop, checkpoints, sharding
    ("jaxtl.pretraining",),             # the pretraining workload, loading by path
    ("jaxtl.tasks",),                   # fine-tuning workloads and prediction
    ("jaxtl.eval", "jaxtl.tools"),      # prompting, lm-eval, the study, benchmarks
    ("jaxtl.configs",),                 # the shipped recipes
    ("jaxtl.programs", "jaxtl.recipes", "jaxtl.__main__"),  # the commands
]


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def import_graph() -> dict[str, set[str]]:
  """module -> the jaxtl modules it imports, at any depth of its code."""
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                   else node.module for a in node.names]
      else:
        continue
      edges.update(t for t in targets if t in modules and t != name)
    graph[name] = edges
  return graph


def _layer(module: str) -> int:
  """The layer of the longest prefix naming ``module`` (a package's
  ``__main__`` may sit above its package)."""
  found = [(len(p), i) for i, prefixes in enumerate(LAYERS) for p in prefixes
           if module == p or module.startswith(p + ".")]
  if not found:
    raise AssertionError(f"{module} is in no layer of LAYERS: add it")
  return max(found)[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
  """Every import of a module from a layer above the importer's."""
  return [f"{a} imports {b}" for a, edges in graph.items() for b in sorted(edges)
          if a != "jaxtl" and _layer(b) > _layer(a)]


def test_the_import_graph_has_no_cycles():
  graph = import_graph()
  state, cycles = {}, []

  def visit(node, stack):
    state[node] = "open"
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
      elif nxt not in state:
        visit(nxt, stack + [nxt])
    state[node] = "done"

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_no_module_imports_a_layer_above_its_own():
  found = upward(import_graph())
  assert not found, "\n".join(found)


def test_the_layer_check_sees_an_import_up_a_layer_and_every_module():
  """The check itself: a model importing the trainer's program is caught,
  the export program sits above the converters, and __main__ files count."""
  graph = import_graph()
  assert "jaxtl.__main__" in graph
  assert _layer("jaxtl.programs.export") > _layer("jaxtl.convert.hf")
  bad = {**graph, "jaxtl.models.layers": graph["jaxtl.models.layers"] | {"jaxtl.programs.train"}}
  assert upward(bad) == ["jaxtl.models.layers imports jaxtl.programs.train"]
