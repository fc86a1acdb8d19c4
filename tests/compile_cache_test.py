"""The command-line entry points keep compiled programs between runs."""

import os
import subprocess
import sys

import pytest

from jaxtl.runtime import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("environ, expected", [
    ({"HOME": "/h"}, "/h/.cache/jaxtl/xla"),
    ({"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/jaxtl/xla"),
    ({"HOME": "/h", "JAXTL_COMPILATION_CACHE": "/elsewhere"}, "/elsewhere"),
    ({"HOME": "/h", "JAXTL_COMPILATION_CACHE": "0"}, None),
    # JAX's own setting, even empty (off), is the user's choice.
    ({"HOME": "/h", "JAX_COMPILATION_CACHE_DIR": "/mine"}, None),
    ({"HOME": "/h", "JAX_COMPILATION_CACHE_DIR": ""}, None),
])
def test_cache_dir(environ, expected, monkeypatch):
  monkeypatch.setenv("HOME", environ["HOME"])  # expanduser reads the real one
  assert compile_cache.cache_dir(environ) == expected


def test_a_folder_that_cannot_be_made_leaves_the_cache_off(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  assert compile_cache.enable({"JAXTL_COMPILATION_CACHE": str(blocker / "sub")}) is None


@pytest.mark.parametrize("environ, expected", [
    ({}, compile_cache.MIN_COMPILE_SECONDS),
    ({"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}, None),  # the user's
])
def test_programs_quicker_than_jaxs_second_are_kept(environ, expected, tmp_path,
                                                    monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  updates = {}
  monkeypatch.setattr(jax.config, "update", updates.__setitem__)
  folder = str(tmp_path / "xla")
  assert compile_cache.enable({"JAXTL_COMPILATION_CACHE": folder, **environ}) == folder
  assert updates["jax_compilation_cache_dir"] == folder
  assert updates.get("jax_persistent_cache_min_compile_time_secs") == expected


_PROGRAM = """
import jax, jax.numpy as jnp
from jaxtl.runtime import startup
startup.tune_process()
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
jax.jit(lambda x: jnp.tanh(x @ x).sum())(jnp.ones((32, 32))).block_until_ready()
print("hits", len(hits))
"""


@pytest.mark.subprocess
def test_a_second_run_loads_what_the_first_compiled(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env.update(JAXTL_COMPILATION_CACHE=str(tmp_path / "xla"), JAXTL_KEEP_MEMORY="0",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  runs = [subprocess.run([sys.executable, "-c", _PROGRAM], cwd=REPO, env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout
          for _ in range(2)]
  assert "hits 0" in runs[0] and "hits 0" not in runs[1]
  assert any(name.endswith("-cache") for name in os.listdir(tmp_path / "xla"))
