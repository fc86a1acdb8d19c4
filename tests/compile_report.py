"""Where the suite's time goes: ``python -m pytest -p compile_report ...``.

Most of a test's time is JAX tracing the program, lowering it to MLIR and
XLA compiling it; ``--durations`` says which tests are slow, this says why.
A ``jax.monitoring`` listener adds each of those three durations, and the
number of compiles, to the test running in the process, and the terminal
summary lists the files and tests with the most wall time beside them.
Runs that tests start in subprocesses count in the wall time only.

With pytest-xdist each worker measures its own tests and sends its table
to the controller when it finishes. ``COMPILE_REPORT_JSON=FILE`` also
writes every test's figures to FILE, for sorting other ways.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

EVENTS = {"/jax/core/compile/backend_compile_duration": "compile_s",
          "/jax/core/compile/jaxpr_trace_duration": "trace_s",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s"}
COLUMNS = ("wall_s", "compile_s", "trace_s", "lower_s", "compiles")

_running: list[str] = []  # the test now running in this process, if any
_tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def _listen(event: str, seconds: float, **_) -> None:
  if _running and event in EVENTS:
    counts = _tests[_running[0]]
    counts[EVENTS[event]] += seconds
    if EVENTS[event] == "compile_s":
      counts["compiles"] += 1


def pytest_configure(config):  # pylint: disable=unused-argument
  import jax  # pylint: disable=import-outside-toplevel  (after conftest's XLA flags)
  jax.monitoring.register_event_duration_secs_listener(_listen)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  _running[:] = [item.nodeid]
  start = time.perf_counter()
  yield
  _tests[item.nodeid]["wall_s"] += time.perf_counter() - start
  _running.clear()


def pytest_sessionfinish(session):
  if hasattr(session.config, "workeroutput"):  # an xdist worker: to the controller
    session.config.workeroutput["compile_report"] = json.dumps(_tests)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pylint: disable=unused-argument
  for nodeid, counts in json.loads(node.workeroutput.get("compile_report", "{}")).items():
    _tests[nodeid].update(counts)


def _table(title: str, rows: dict[str, collections.Counter], top: int) -> list[str]:
  lines = [f"{title}: {' '.join(f'{c:>9}' for c in COLUMNS)}"]
  for name, counts in sorted(rows.items(), key=lambda kv: -kv[1]["wall_s"])[:top]:
    figures = " ".join(f"{counts[c]:9.0f}" if c == "compiles" else f"{counts[c]:9.1f}"
                       for c in COLUMNS)
    lines.append(f"{' ' * len(title)}  {figures}  {name}")
  return lines


def pytest_terminal_summary(terminalreporter):
  if not _tests:
    return
  files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  total: collections.Counter = collections.Counter()
  for nodeid, counts in _tests.items():
    files[nodeid.split("::")[0]].update(counts)
    total.update(counts)
  if os.environ.get("COMPILE_REPORT_JSON"):
    with open(os.environ["COMPILE_REPORT_JSON"], "w") as f:
      json.dump(_tests, f, indent=0)
  write = terminalreporter.write_line
  terminalreporter.section("compile report (seconds of test time, all workers)")
  for line in (_table("all", {"every test": total}, 1) + _table("files", files, 15)
               + _table("tests", _tests, 15)):
    write(line)
