"""The ``jaxtl`` command: recipe names resolve to the shipped files, users'
own files win, unknown names are refused, and the wheel ships one package."""

import os
import pathlib
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
import setuptools

from jaxtl.programs import cli
import datadir
import runs

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("value", ["pretrain_clm", "pretrain_clm.py",
                                   "configs/pretrain_clm.py", "jaxtl/configs/pretrain_clm.py"])
def test_recipe_names_resolve_to_the_shipped_file(value, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # not the repository: no configs/ beside us
  path, _, arg = cli.recipe_path(value + ":model=bert_mini").partition(":")
  assert path == str(REPO / "configs" / "pretrain_clm.py") and arg == "model=bert_mini"


def test_a_users_own_file_wins(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "pretrain_clm.py").write_text("")
  assert cli.recipe_path("configs/pretrain_clm.py:x=1") == "configs/pretrain_clm.py:x=1"
  assert cli.with_recipe_paths(["prog", "--config", "configs/pretrain_clm.py"])[2] == \
      "configs/pretrain_clm.py"


def test_unknown_recipes_and_commands_are_named(capsys):
  with pytest.raises(SystemExit) as stop:
    cli.recipe_path("pretrain_nope")
  assert stop.value.code == 2
  assert "'pretrain_nope' is not a shipped recipe" in capsys.readouterr().err
  with pytest.raises(SystemExit) as stop:
    cli.run(["jaxtl", "pretrian"])
  assert stop.value.code == 2
  assert "unknown command 'pretrian' (pretrain?); known: pretrain, finetune" in (
      capsys.readouterr().err)


@pytest.mark.subprocess
def test_the_command_runs_a_module_with_its_flags():
  out = subprocess.run([sys.executable, "-m", "jaxtl", "convert", "--help"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAXTL_KEEP_MEMORY": "0"})
  assert "--checkpoint: A jaxtl workdir" in out.stdout + out.stderr  # absl's --help
  # Its docstring, without the reference page's markup (``x``, :mod:`x`).
  assert "jaxtl convert: export a jaxtl" in out.stdout and "`" not in out.stdout


def test_help_text_drops_sphinx_markup():
  doc = "``jaxtl x``: see :mod:`jaxtl.a.b` and :func:`~jaxtl.c`; ``--in`` is a `file`."
  assert cli.for_terminal(doc) == "jaxtl x: see jaxtl.a.b and jaxtl.c; --in is a `file`."
  assert cli.for_terminal(None) is None


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_wheel_ships_the_jaxtl_package_with_the_top_level_recipes(tmp_path):
  """configs/ is the one home of the recipes, installed as jaxtl.configs: a
  wheel holds them, and a fresh virtualenv with it installed, away from the
  clone, pretrains with a recipe named on its command line."""
  setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
  found = setuptools.find_packages(str(REPO), include=["jaxtl*"])
  assert sorted(setup["packages"]) == sorted([*found, "jaxtl.configs"])
  assert setup["package-dir"] == {"jaxtl.configs": "configs"}
  assert not (REPO / "jaxtl" / "configs").exists()  # one copy
  # The setuptools of this environment builds it: no isolated build
  # environment to fetch from the package index.
  subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                  "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                 check=True, capture_output=True, timeout=300)
  wheel = next(tmp_path.glob("jaxtl-*.whl"))
  names = zipfile.ZipFile(wheel).namelist()
  assert "jaxtl/configs/pretrain_clm.py" in names and "jaxtl/configs/common.py" in names
  assert not [n for n in names if n.startswith("configs/")]
  # A fresh virtualenv: the wheel installed by pip, its dependencies seen
  # through a .pth (this one's site-packages, whose editable jaxtl is not
  # activated there: a .pth's own .pth files are not read).
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=120)
  fresh = venv / "bin" / "python"
  site = subprocess.run([str(fresh), "-c", "import sysconfig; print(sysconfig.get_paths()"
                         "['purelib'])"], capture_output=True, text=True, check=True).stdout
  pathlib.Path(site.strip(), "deps.pth").write_text(
      sysconfig.get_paths()["purelib"] + "\n")
  subprocess.run([sys.executable, "-m", "pip", "--python", str(fresh), "install", "-q",
                  "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True,
                 timeout=300)
  env = {**os.environ, "JAXTL_KEEP_MEMORY": "0", "XLA_FLAGS": runs.XLA_FLAGS,
         "JAX_PLATFORMS": "cpu"}
  where = subprocess.run([str(fresh), "-c", "import jaxtl; print(jaxtl.__file__)"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, check=True)
  assert where.stdout.startswith(str(venv)), where.stdout  # not the clone's
  out = subprocess.run([str(venv / "bin" / "jaxtl"), "config", "pretrain_clm",
                        "--filter=train.steps"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env=env)
  assert out.stdout.startswith("--config.train.steps=400  (int)"), out.stderr[-2000:]
  if datadir.data_dir() is None or not (datadir.data_dir() / "imdb").is_dir():
    return  # the recipe's corpus is not here: the run is tested where it is
  # pretrain_mlm reads JSON lines; pretrain_clm's TFDS would import TensorFlow
  # (8 s) for what configs_test runs already.
  run = subprocess.run(
      [str(venv / "bin" / "jaxtl"), "pretrain", "--config=pretrain_mlm",
       f"--workdir={tmp_path / 'mlm'}", "--config.train.steps=2",
       "--config.train.eval_every=2", "--config.train.eval_batches=1",
       "--config.data.max_docs=100", "--config.data.tokenizer.vocab_size=300",
       "--config.data.batch_size=8", "--config.data.seq_len=32",
       "--config.model.num_layers=1"],
      cwd=tmp_path, capture_output=True, text=True, timeout=600,
      env={**env, "JAXTL_DATA_DIR": str(datadir.data_dir())})
  assert run.returncode == 0, run.stderr[-3000:]
  assert (tmp_path / "mlm" / "checkpoints" / "2").is_dir()


def test_the_command_line_explains_itself(capsys):
  """Each command has a line in --help, the recipes theirs (helpers
  left out), a training command its own help, a recipe its keys."""
  with pytest.raises(SystemExit) as stop:
    cli.run(["jaxtl", "--help"])
  assert stop.value.code == 0
  out = capsys.readouterr().out
  assert all(f"  {name}" in out for name in cli.COMMANDS) and "jaxtl 0.1.0" in out
  cli.run(["jaxtl", "recipes"])
  out = capsys.readouterr().out
  assert "finetune_minilm     Fine-tune a pretrained Hugging Face BERT" in out
  assert "common" not in out and "  models" not in out
  assert "general-domain causal LM of pretrain_clm (stage 1)" in out  # ulmfit's sentence
  cli.run(["jaxtl", "pretrain", "--help"])
  out = capsys.readouterr().out
  assert out.startswith("usage: jaxtl pretrain --config=RECIPE") and "pretrain_mlm" in out
  assert "finetune_minilm" not in out
  cli.run(["jaxtl", "config", "finetune:task=files", "--filter=task.t"])
  lines = capsys.readouterr().out.splitlines()
  assert ("--config.task.text_fields=\"('text',)\"  (tuple)  the input fields (a,b): one, "
          "two for pairs; tagging: the words list") in lines  # with its meaning
  assert all(line.startswith("--config.task.t") for line in lines)
  with pytest.raises(SystemExit) as stop:
    cli.run(["jaxtl", "config", "finetune", "--filter=nope"])
  assert stop.value.code == 2 and "no key starts so; the sections: adapt," in (
      capsys.readouterr().err)
  with pytest.raises(SystemExit) as stop:  # a typo: the closest section or key
    cli.run(["jaxtl", "config", "finetune", "--filter=trainn"])
  assert "--filter=trainn: no key starts so (train?); the sections:" in capsys.readouterr().err
  with pytest.raises(SystemExit) as stop:  # a section's key misspelt
    cli.run(["jaxtl", "config", "finetune", "--filter=optim.learning_rate"])
  assert ("--filter=optim.learning_rate: no key starts so; --filter=optim lists that "
          "section's keys") in capsys.readouterr().err


@pytest.mark.parametrize("recipe", ["finetune:task=files", "pretrain_mlm"])
def test_each_line_of_jaxtl_config_pasted_into_a_shell_sets_what_it_shows(recipe):
  import shlex  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from jaxtl import recipes  # pylint: disable=g-import-not-at-top
  from jaxtl.train import identity  # pylint: disable=g-import-not-at-top
  config = recipes.load(cli.recipe_path(recipe))
  # Each line: --config.KEY=VALUE, then two spaces and "(type)".
  shown = [shlex.split(line.split("  (")[0])[0] for line in recipes.table(config).splitlines()]
  argv = ["jaxtl", f"--config={cli.recipe_path(recipe)}", *shown]
  values = flags.FlagValues()  # the overrides' flags are made from sys_argv
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
  values(argv)
  assert len(shown) > 50
  assert identity.flatten(values.config) == identity.flatten(config)


def test_the_wheel_lists_every_package_of_the_tree():
  """pyproject.toml names the packages the wheel holds: a folder moved or
  added under jaxtl/ must be listed there, or the installed jaxtl lacks it."""
  repo = pathlib.Path(__file__).resolve().parent.parent
  listed = set(tomllib.loads((repo / "pyproject.toml").read_text())
               ["tool"]["setuptools"]["packages"])
  tree = {".".join(p.parent.relative_to(repo).parts)
          for p in (repo / "jaxtl").rglob("__init__.py")}
  assert tree | {"jaxtl.configs"} == listed
