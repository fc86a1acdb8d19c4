"""The entry points' restart onto huge pages: when it happens, and that it does."""

import os
import platform
import subprocess
import sys

import pytest

from jaxtl.runtime import hugepages

GLIBC = ("glibc", "2.36")


def test_restarts_only_where_the_tunable_helps():
  value = hugepages.tunables_with_huge_pages({}, "madvise", GLIBC)
  assert value == "glibc.malloc.hugetlb=1"
  kept = hugepages.tunables_with_huge_pages(
      {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC)
  assert kept == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
  no_restart = [
      ({"JAXTL_HUGE_PAGES": "0"}, "madvise", GLIBC),  # opted out
      ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC),  # user's choice
      ({}, "always", GLIBC),  # the kernel already uses huge pages
      ({}, "never", GLIBC),
      ({}, "", GLIBC),  # no THP on this kernel
      ({}, "madvise", ("glibc", "2.31")),  # too old to know the tunable
      ({}, "madvise", ("", "")),  # musl
  ]
  for environ, mode, libc in no_restart:
    assert hugepages.tunables_with_huge_pages(environ, mode, libc) is None, (environ, mode, libc)


def test_reads_the_bracketed_kernel_mode(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert hugepages.thp_mode(str(path)) == "madvise"
  assert hugepages.thp_mode(str(tmp_path / "missing")) == ""


@pytest.mark.subprocess
@pytest.mark.skipif(sys.platform != "linux", reason="glibc tunables are Linux-only")
def test_an_entry_point_reexecutes_itself_once_with_the_tunable():
  code = ("import os; from jaxtl.runtime import hugepages; print('start', flush=True); "
          "hugepages.restart_with_huge_pages(); print(os.environ.get('GLIBC_TUNABLES'))")
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", "JAXTL_HUGE_PAGES")}
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True).stdout.split()
  expected = hugepages.tunables_with_huge_pages(env, hugepages.thp_mode(),
                                                platform.libc_ver())
  if expected is None:  # this machine gains nothing: no restart
    assert out == ["start", "None"]
  else:
    assert out == ["start", "start", expected]


def test_fine_tuning_and_prediction_start_without_the_restart(monkeypatch):
  """Their batches come in several lengths, whose longer steps ran 2-2.5x
  slower on huge pages (runtime/hugepages.py); one-shape steps keep them."""
  from jaxtl.programs import cli
  from jaxtl.runtime import compile_cache, startup, xla_cpu
  restarts = []
  monkeypatch.setattr(xla_cpu, "apply", lambda: None)
  monkeypatch.setattr(compile_cache, "enable", lambda: None)
  monkeypatch.setattr(hugepages, "restart_with_huge_pages", lambda: restarts.append(1))
  for name in ("finetune", "predict", "pretrain", "benchmark"):
    startup.tune_process(huge_pages=cli.COMMANDS[name].huge_pages)
  assert restarts == [1, 1]
