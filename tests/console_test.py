"""What a user sees: a quiet console, the config in a file, ETAs in log lines,
log lines above (not glued onto) progress bars."""

import importlib.util
import io
import json
import logging
import os
import pathlib
import re
import subprocess
import sys

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags
import pytest

from jaxtl.runtime import console
from jaxtl.train import metrics

import runs

REPO = pathlib.Path(__file__).resolve().parent.parent
JAXTL_FILES = {p.name for p in (REPO / "jaxtl").rglob("*.py")}
INFO_LINE = re.compile(r"^I\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] ", re.M)  # absl's (--verbose)
SHORT_LINE = re.compile(r"^\d\d:\d\d:\d\d (warning: |error: )?\S", re.M)  # the console's
LOG_ENV = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "TQDM_DISABLE")


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
  """configs/pretrain_clm.py on a small synthetic corpus, four steps."""
  return runs.tiny_clm_config(tmp_path_factory.mktemp("console"), """
      c.data.update(seq_len=16, batch_size=4)
      c.model.update(num_layers=1, d_model=16, num_heads=2, head_dim=8, mlp_dim=32)
      c.optim.warmup_steps = 1
      c.train.update(steps=4, log_every=2, eval_every=4, eval_batches=1)
  """, lines=500)


def _main(config, workdir, *flags):
  env = {**os.environ, "XLA_FLAGS": runs.XLA_FLAGS, "JAX_PLATFORMS": "cpu"}
  for name in LOG_ENV:  # what the entry point decides, not the test runner
    env.pop(name, None)
  proc = subprocess.run(
      [sys.executable, "-m", "jaxtl", "pretrain", f"--config={config}",
       f"--workdir={workdir}", *flags], cwd=REPO, env=env, capture_output=True,
      text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_console_is_quiet_and_verbose_brings_the_libraries_back(tiny_config, tmp_path):
  workdir = tmp_path / "run"
  out = _main(tiny_config, workdir)
  config_file = workdir / "config.txt"
  assert config_file.is_file()
  assert f"config written to {config_file}" in out
  assert "] config:\n" not in out and "vocab_multiple:" not in out
  # Each line the time and what was said, not absl's prefix (--verbose's).
  assert SHORT_LINE.findall(out) and not INFO_LINE.findall(out), out
  for chatter in ("orbax", "xla_bridge", "Unable to initialize backend",
                  "tensorflow", "oneDNN", "absl::InitializeLog"):
    assert chatter not in out, out
  assert re.search(r"step 2/4 train \(ETA [\d:]+\): loss=", out), out
  assert re.search(r"step 4/4 train: loss=", out), out
  assert "ETA" not in (workdir / "metrics.jsonl").read_text()

  # Started again (already trained: it restores and evaluates), verbosely.
  out = _main(tiny_config, workdir, "--verbose")
  assert "] config:\n" in out and "vocab_multiple:" in out
  assert "orbax" in out  # restoring logs through Orbax's INFO lines
  assert not set(INFO_LINE.findall(out)) <= JAXTL_FILES
  headers = [l for l in config_file.read_text().splitlines() if l.startswith("# ")]
  assert len(headers) == 2 and "--verbose" in headers[1]


@pytest.mark.parametrize("argv,verbose", [
    (["main"], False), (["main", "--verbose"], True),
    (["main", "--config=x.py:model=bert_tiny", "--verbose=true", "--workdir", "w"], True),
    (["main", "--verbose", "--noverbose"], False)])
def test_log_environment_is_set_before_flags_are_parsed(monkeypatch, argv, verbose):
  for name in LOG_ENV:
    monkeypatch.delenv(name, raising=False)
  console.set_log_environment(argv)
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == ("0" if verbose else "1")
  assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "0"
  # pytest captures stderr: not a terminal, so library bars are off unless verbose.
  assert os.environ.get("TQDM_DISABLE") == (None if verbose else "1")


def test_users_log_environment_wins(monkeypatch):
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
  console.set_log_environment(["main", "--verbose"])
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow not installed")
def test_tensorflow_loads_silently():
  env = {k: v for k, v in os.environ.items() if k not in LOG_ENV}
  code = ("import sys; from jaxtl.runtime import console; console.set_log_environment(sys.argv); "
          "import tensorflow")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def _line_before(out: str, mark: str) -> str:
  """What the terminal line holds when ``mark`` starts printing."""
  head = out[:out.index(mark)]
  return head[max(head.rfind("\r"), head.rfind("\n")) + 1:]


@pytest.mark.parametrize("absl_handler", [False, True])
def test_log_lines_are_written_above_the_bar(monkeypatch, caplog, absl_handler):
  term = _Terminal()
  monkeypatch.setattr(sys, "stderr", term)
  if absl_handler:  # not a StreamHandler: what logging_redirect_tqdm misses
    handler = absl_logging.get_absl_handler()
    monkeypatch.setattr(handler.python_handler, "stream", term)
  else:
    handler = logging.StreamHandler(term)
  root = logging.getLogger()
  caplog.set_level(logging.INFO)
  monkeypatch.setattr(root, "handlers", [handler])

  bar = metrics.progress_bar(total=3, desc="train")
  bar.update(1)
  logging.info("first line")
  inner = metrics.progress_bar(range(10), desc="dev", leave=False)
  for _ in inner:
    pass
  assert any(isinstance(h, metrics._AboveBars) for h in root.handlers)
  logging.warning("second line")
  bar.close()
  assert root.handlers == [handler]
  logging.info("third line")

  out = term.getvalue()
  for mark in ("first line", "second line"):
    assert "train" not in _line_before(out, mark), repr(out)
    assert "|" not in _line_before(out, mark), repr(out)


def test_no_bar_and_no_handler_swap_off_a_terminal(monkeypatch):
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  root = logging.getLogger()
  handlers = list(root.handlers)
  bar = metrics.progress_bar(total=3, desc="train")
  assert bar.disable and root.handlers == handlers
  bar.close()
  monkeypatch.setattr(sys, "stderr", _Terminal())
  assert metrics.progress_bar(range(3), desc="dev", min_total=8).disable


def test_eta_leaves_the_first_window_compile_time_out(monkeypatch):
  clock = iter([0.0, 10.0, 12.0, 14.0])
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
  eta = metrics.Eta(total=10, start=0)
  assert eta(2) == pytest.approx(40.0)  # 2 steps in 10 s (with the compile)
  assert eta(4) == pytest.approx(6.0)  # then 2 steps in 2 s
  assert eta(10) is None


def test_eta_goes_to_the_console_not_to_the_files(tmp_path, caplog):
  writer = metrics.MetricsWriter(str(tmp_path))
  with caplog.at_level(logging.INFO):
    writer.write(50, "train", {"loss": 2.5}, total=400, eta=3725.0)
  writer.close()
  assert "step 50/400 train (ETA 1:02:05): loss=2.5" in caplog.text
  record = json.loads((tmp_path / "metrics.jsonl").read_text())
  assert record == {"step": 50, "split": "train", "loss": 2.5}


def test_a_missing_package_is_named_with_the_pip_command_that_installs_it():
  missing = ModuleNotFoundError("No module named 'datasets'", name="datasets")
  assert console.describe(missing) == ("this needs the package 'datasets', which is "
                                       "not installed: pip install datasets")
  tfds = ModuleNotFoundError("No module named 'tensorflow_datasets.core'",
                             name="tensorflow_datasets.core")
  assert console.describe(tfds).endswith("pip install 'jaxtl[tfds]'")
  # A library's own message, already naming the command, is kept.
  assert console.describe(ImportError("pyarrow is needed: pip install pyarrow")) == \
      "pyarrow is needed: pip install pyarrow"


def test_an_os_error_on_a_users_path_is_the_path_and_what_is_wrong():
  for error in (FileExistsError, PermissionError, FileNotFoundError):
    assert issubclass(error, console.MISTAKES)  # one line, exit 2
  exists = FileExistsError(17, "File exists", "runs/out")
  assert console.describe(exists) == "runs/out: File exists"  # not "[Errno 17] ..."
  # jaxtl's own message, naming the fix, is kept as it is.
  assert console.describe(FileNotFoundError("data file not found: dev.jsonl")) == \
      "data file not found: dev.jsonl"


def test_an_unknown_config_key_is_named_with_the_keys_its_section_has(tmp_path):
  """ml_collections says only "'learning_rate'"; the line names the section
  and its keys (a long section: the closest names and where all are)."""
  recipe = tmp_path / "recipe.py"
  recipe.write_text(
      "import ml_collections\n"
      "def get_config():\n"
      "  return ml_collections.ConfigDict({'optim': {'lr': 1.0, 'eps': 1e-8},\n"
      "      'model': {**{f'k{i}': i for i in range(20)}, 'num_layers': 2}})\n")
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values)
  missing = lambda *overrides: console.unknown_config_key(
      [f"--config={recipe}", "--workdir=w", *overrides], values)
  assert missing("--config.optim.learning_rate=1") == (
      "config.optim has no key 'learning_rate'; it has eps, lr")
  assert missing("--config.optim.lr=2", "--config.modle.k1=1") == (
      "config has no key 'modle'; it has model, optim")
  assert missing("--config.model.num_layer=3").startswith(
      "config.model has no key 'num_layer'; close: num_layers")
  assert "(jaxtl config recipe --filter=model lists them all)" in missing(
      "--config.model.num_layer=3")
  # Every key there (a bad value, a value indexed as a section): not this error.
  assert missing("--config.optim.lr=x") is None
  assert missing("--config.optim.lr.x=1") is None


def test_an_unknown_flag_is_named_with_the_recipe_key_or_the_commands_own_flags(tmp_path):
  recipe = tmp_path / "recipe.py"
  recipe.write_text("import ml_collections\n"
                    "def get_config():\n"
                    "  return ml_collections.ConfigDict({'train': {'epochs': 3}})\n")
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values)
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  flags.DEFINE_string("input", None, "", flag_values=values)
  for name in ("config", "workdir", "input"):
    values.register_key_flag_for_module("prog", values[name])
  argv = ["prog", f"--config={recipe}"]
  prog = console.program()  # the command's name, as an earlier test may have set it
  assert console.unknown_flag("epochs", argv, values) == (
      f"--epochs is not a flag of {prog}: the recipe's key is --config.train.epochs")
  assert console.unknown_flag("inptu", argv, values) == (
      f"--inptu is not a flag of {prog}: --input? it takes --config, --input, --workdir "
      f"({prog} --help says what each is)")
  assert console.unknown_flag("checkpoint", ["prog"], values).startswith(
      f"--checkpoint is not a flag of {prog}: it takes --config")
  # A recipe's key with no recipe: absl has no --config.* flags to know it by.
  assert console.unknown_flag("config.train.epochs", ["prog", "--workdir=w"], values) == (
      f"--config.train.epochs sets a key of a recipe, and no recipe is named: add "
      f"--config=RECIPE ({prog} --help lists the recipes)")


def test_a_console_line_is_the_time_and_the_message_and_library_info_is_left_out():
  """What a run prints without --verbose (absl's prefix with it)."""
  def record(level, path, message):
    return logging.LogRecord("absl", level, path, 1, message, None, None)
  own = str(REPO / "jaxtl" / "train" / "metrics.py")
  short = console._Short()  # pylint: disable=protected-access
  assert re.fullmatch(r"\d\d:\d\d:\d\d step 4 eval: loss=1",
                      short.format(record(logging.INFO, own, "step 4 eval: loss=1")))
  assert re.fullmatch(r"\d\d:\d\d:\d\d warning: resuming",
                      short.format(record(logging.WARNING, own, "resuming")))
  keep = console._OwnInfoOnly().filter  # pylint: disable=protected-access
  assert keep(record(logging.INFO, own, "step 4"))
  assert not keep(record(logging.INFO, "/site-packages/orbax/x.py", "saving"))
  assert keep(record(logging.WARNING, "/site-packages/orbax/x.py", "slow disk"))
