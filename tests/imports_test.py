"""The package's import graph: no cycles, and the core never imports the
tools, the recipes or the tasks built on it. Every module is in a layer,
``__main__`` files included (a program sits above what it runs)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxtl"
# The layers of the house, bottom up: a module may import its own layer and
# those below it, never one above. docs/architecture.md tables the same.
LAYERS = [
    ("jaxtl.runtime", "jaxtl.layout", "jaxtl.sections"),  # process set-up, console,
                                        # workdir names, typed config sections
    ("jaxtl.models",),                  # Flax modules, configs, families
    ("jaxtl.decoding",),                # KV-cache generation, sampling
    ("jaxtl.data",),                    # sources, tokenizers, rows, batches
    ("jaxtl.objectives",),              # pretraining objectives and losses
    ("jaxtl.convert",),                 # Hugging Face weights in and out
    ("jaxtl.train",),                   # the step, the loop, checkpoints, sharding
    ("jaxtl.pretraining",),             # the pretraining workload, loading by path
    ("jaxtl.tasks",),                   # fine-tuning workloads and prediction
    ("jaxtl.eval",),                    # scoring, prompting, lm-eval
    ("jaxtl.configs",),                 # the shipped recipes
    ("jaxtl.tools",),                   # the transfer study, benchmarks, analysis
    ("jaxtl.programs", "jaxtl.recipes", "jaxtl.training", "jaxtl.__main__"),  # the
                                        # commands, and runs started from Python
]


def _modules() -> dict[str, pathlib.Path]:
  """Every module of the package, and the recipes (configs/, installed as
  jaxtl.configs)."""
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  for path in (PACKAGE.parent / "configs").glob("*.py"):
    name = "" if path.stem == "__init__" else "." + path.stem
    out["jaxtl.configs" + name] = path
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


# Function-local imports are kept only for heavy or optional packages, each
# for its reason (docs/architecture.md); everything else is imported at the
# top of its module, where the import graph above sees it.
LAZY = {
    "torch": "optional (jaxtl[hf]), ~2 s: .bin checkpoints and the PyTorch benchmark only",
    "transformers": "optional (jaxtl[hf]), seconds: the PyTorch side of the benchmark only",
    "datasets": "optional (jaxtl[hf]), imports pandas and pyarrow: Hugging Face datasets only",
    "huggingface_hub": "optional, comes with datasets: its offline switch and endpoint",
    "tensorflow": "optional (jaxtl[tfds]), seconds: reading TFDS datasets only",
    "tensorflow_datasets": "optional (jaxtl[tfds]), imports TensorFlow",
    "matplotlib": "optional (jaxtl[analysis]), slow to import: figures only",
    "lm_eval": "optional (jaxtl[eval]): EleutherAI's harness only",
    "tensorboardX": "~3 s when it pulls in torch: imported on first write, torch blocked",
    "rouge_score": "imports NLTK, ~2 s: generation tasks scored by ROUGE only",
    "sacrebleu": "~0.1 s and 120 modules: generation tasks scored by BLEU only",
    "grain": "imports JAX, ~1 s: jaxtl.data loads without JAX until batches are made",
    "pyarrow": "~50 modules: Parquet files only; jaxtl.data loads without Arrow",
    "array_record": "no wheel on some platforms: guarded, so a clear error names it",
    "keras": "optional (comes with jaxtl[tfds]): fixes its backend at import; the "
             "benchmark's KerasHub child only",
    "keras_hub": "optional (pip install --no-deps keras-hub), imports TensorFlow when "
                 "installed: the benchmark's KerasHub child only",
}
# jaxtl's own modules or core packages imported late in one place, for its reason.
LAZY_HERE = {
    ("jaxtl/__init__.py", "jaxtl.tasks"):
        "jaxtl.load: `import jaxtl` (run by every jaxtl.* import) loads no JAX",
    ("jaxtl/__init__.py", "jaxtl"):
        "jaxtl.pretrain, finetune, study: jaxtl.training, which loads JAX",
    ("jaxtl/recipes.py", "jaxtl.configs"):
        "the recipes' sections import JAX; the CLI imports recipes before it tunes the process",
    ("jaxtl/runtime/compile_cache.py", "jax"):
        "the CLI imports it before the process is tuned (the malloc restart)",
    ("jaxtl/runtime/malloc.py", "jax"):
        "its restart re-executes the process: JAX is loaded only after it",
}
MAX_LOCAL_IMPORTS = 40


def function_local_imports() -> list[tuple[str, str, int]]:
  """(file relative to the repository, imported module, line) of every import
  inside a function of the package."""
  found = []
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE.parent).as_posix()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for sub in ast.walk(node):
          if isinstance(sub, ast.Import):
            found += [(rel, a.name, sub.lineno) for a in sub.names]
          elif isinstance(sub, ast.ImportFrom):
            found.append((rel, "." * sub.level + (sub.module or ""), sub.lineno))
  return sorted(set(found))


def test_function_local_imports_are_heavy_optional_packages():
  found = function_local_imports()
  unjustified = [f"{rel}:{line} imports {module}" for rel, module, line in found
                 if module.split(".")[0] not in LAZY and (rel, module) not in LAZY_HERE]
  assert not unjustified, ("import these at the top of the module, or give the "
                           "package's reason in LAZY:\n  " + "\n  ".join(unjustified))
  assert len(found) <= MAX_LOCAL_IMPORTS, f"{len(found)} function-local imports"
  assert all(reason for reason in {**LAZY, **LAZY_HERE}.values())


def test_no_library_module_has_a_main_block():
  """Programs are started by jaxtl/programs/cli.py (``jaxtl COMMAND``, or
  ``python -m jaxtl COMMAND`` through jaxtl/__main__.py), never as scripts."""
  found = [path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*.py")
           if path != PACKAGE / "__main__.py"
           and any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
                   and "__main__" in ast.unparse(node.test)
                   for node in ast.walk(ast.parse(path.read_text())))]
  assert not found, f"__main__ blocks in {sorted(found)}"
