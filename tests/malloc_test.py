"""The entry points' restart with a malloc that keeps the memory it frees,
and their CPU programs run on the calling thread: when, and that it happens."""

import os
import platform
import subprocess
import sys

import pytest

from jaxtl.runtime import malloc

GLIBC = ("glibc", "2.36")
OURS = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"


def test_restarts_only_where_the_tunables_apply():
  assert malloc.tunables_keeping_memory({}, GLIBC) == OURS
  kept = malloc.tunables_keeping_memory({"GLIBC_TUNABLES": "glibc.rtld.nns=8"}, GLIBC)
  assert kept == "glibc.rtld.nns=8:" + OURS
  no_restart = [
      ({"JAXTL_KEEP_MEMORY": "0"}, GLIBC),  # opted out
      ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, GLIBC),  # the user's choice
      ({"GLIBC_TUNABLES": OURS}, GLIBC),  # already restarted
      ({}, ("glibc", "2.17")),  # too old to read tunables
      ({}, ("", "")),  # musl
  ]
  for environ, libc in no_restart:
    assert malloc.tunables_keeping_memory(environ, libc) is None, (environ, libc)


@pytest.mark.subprocess
@pytest.mark.skipif(sys.platform != "linux", reason="glibc tunables are Linux-only")
def test_an_entry_point_reexecutes_itself_once_with_the_tunables():
  code = ("import os; from jaxtl.runtime import malloc; print('start', flush=True); "
          "malloc.restart_keeping_memory(); print(os.environ.get('GLIBC_TUNABLES')); "
          "print(malloc.describe().replace(' ', '_'))")
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", malloc.OPT_OUT)}
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True).stdout.split()
  if malloc.tunables_keeping_memory(env, platform.libc_ver()) is None:  # no glibc
    assert out[:2] == ["start", "None"]
  else:
    assert out == ["start", "start", OURS, "malloc_keeps_freed_memory_(glibc_tunables)"]


def test_cpu_programs_run_on_the_calling_thread_unless_opted_out(monkeypatch):
  import jax
  updates = []
  monkeypatch.setattr(jax.config, "update", lambda *a: updates.append(a))
  malloc.dispatch_inline({})
  malloc.dispatch_inline({"JAXTL_KEEP_MEMORY": "0"})
  assert updates == [("jax_cpu_enable_async_dispatch", False)]


def test_every_command_starts_with_both_halves(monkeypatch):
  """Fine-tuning and prediction too: their steps of several lengths gain
  from kept memory as one-shape steps do (the huge pages before did not)."""
  from jaxtl.programs import cli
  from jaxtl.runtime import compile_cache, startup
  calls = []
  monkeypatch.setattr(compile_cache, "enable", lambda: None)
  monkeypatch.setattr(malloc, "restart_keeping_memory", lambda: calls.append("restart"))
  monkeypatch.setattr(malloc, "dispatch_inline", lambda: calls.append("inline"))
  names = ("finetune", "predict", "pretrain", "benchmark")
  for name in names:
    startup.tune_process(compilation_cache=cli.COMMANDS[name].compilation_cache)
  assert calls == ["restart", "inline"] * len(names)
