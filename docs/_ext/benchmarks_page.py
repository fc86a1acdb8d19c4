"""The benchmarks page, made from ``launch/benchmark_results.md``.

``jaxtl benchmark --results=launch/benchmark_results.md`` appends one block
per run: a ``### DATE · DEVICE · VERSIONS`` heading, the command, and a table
with a row per preset. This module reads those blocks back and writes the
page: per device, the newest side-by-side row of each preset, drawn (step time
against PyTorch, and MFU where the device has a known peak) and tabled, the
newest rows against KerasHub, then every run as it was recorded, newest first.
"""

from __future__ import annotations

import dataclasses
import io
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

matplotlib.rcParams["svg.hashsalt"] = "jaxtl"  # the same SVG for the same data


@dataclasses.dataclass
class Run:
  """One recorded block: its heading's parts, its command, its tables."""
  date: str
  device: str  # e.g. "CPU (2 cores, AMD EPYC (...); XLA:CPU flags: default)"
  versions: str
  command: str = ""
  tables: list[list[dict[str, str]]] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)
  text: list[str] = dataclasses.field(default_factory=list)  # its Markdown lines


def _row(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def parse(text: str) -> list[Run]:
  """The runs of a results file, in file order (oldest first)."""
  runs: list[Run] = []
  header: list[str] | None = None
  note, pending = "", []  # a note describes the runs after it
  for line in text.splitlines():
    if line.startswith("<!--"):
      note = line
      if not line.rstrip().endswith("-->"):
        continue
    elif note and not note.rstrip().endswith("-->"):
      note += " " + line
      continue
    if note:
      pending.append(note.removeprefix("<!--").removesuffix("-->").strip())
      note = ""
      continue
    if line.startswith("### "):
      date, device, *versions = line[4:].split(" · ")
      runs.append(Run(date.strip(), device.strip(), " · ".join(versions).strip(),
                      notes=pending))
      header, pending = None, []
      continue
    if not runs:
      continue
    run = runs[-1]
    run.text.append(line)
    if line.startswith("`") and not run.command:
      run.command = line.strip("`")
    elif line.startswith("|") and set(line) <= set("|-: "):
      continue
    elif line.startswith("|") and header is None:
      header = _row(line)
      run.tables.append([])
    elif line.startswith("|"):
      run.tables[-1].append(dict(zip(header, _row(line))))
    else:
      header = None
  return runs


def device_name(device: str) -> str | None:
  """A short name to group runs by; None for runs under experimental flags."""
  if "XLA:CPU flags:" in device and "XLA:CPU flags: default" not in device:
    return None
  if device.startswith("CPU"):
    # Early runs recorded the architecture (x86_64), not the CPU's model.
    model = re.search(r"cores, ([^(;)]+)", device)
    model = model.group(1).strip() if model and model.group(1).strip() != "x86_64" else "?"
    cores = re.search(r"(\d+) cores", device)
    return f"CPU: {model}, {cores.group(1) if cores else '?'} cores"
  return device


def _number(cell: str) -> float | None:
  match = re.match(r"[\d,.]+", cell or "")
  return float(match.group(0).replace(",", "")) if match and match.group(0) != "." else None


def headline(runs: list[Run], against: str = "PyTorch"
             ) -> dict[str, list[tuple[Run, dict[str, str]]]]:
  """Per device, the newest row of each preset measured against ``against``
  (PyTorch or KerasHub; CPU runs that did not record the CPU's model are
  left to the full list)."""
  newest: dict[str, dict[str, tuple[Run, dict[str, str]]]] = {}
  for run in runs:  # oldest first: later rows replace earlier ones
    name = device_name(run.device)
    for table in run.tables:
      for row in table:
        if (name and not name.startswith("CPU: ?") and "step ms" in row
            and _number(row.get(f"{against} tokens/s", ""))):
          newest.setdefault(name, {})[row["preset"]] = (run, row)
  return {name: list(rows.values()) for name, rows in newest.items()}


def plot(device: str, rows: list[tuple[Run, dict[str, str]]]) -> bytes:
  """Step time against PyTorch per preset, and MFU where it is known, as SVG."""
  presets = [row["preset"] for _, row in rows]
  mfu = [(_number(r.get("MFU", "")), _number(r.get("PyTorch MFU", ""))) for _, r in rows]
  panels = 2 if all(m[0] for m in mfu) else 1
  fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.2), squeeze=False)
  x = range(len(presets))
  dates = sorted({run.date for run, _ in rows})
  series = [("step ms (lower is faster)",
             [(_number(r["step ms"]), _number(r["PyTorch step ms"])) for _, r in rows])]
  if panels == 2:
    series.append(("MFU (%)", mfu))
  for ax, (label, values) in zip(axes[0], series):
    ax.bar([i - 0.2 for i in x], [v[0] for v in values], 0.4, label="jaxtl", color="#3465a4")
    ax.bar([i + 0.2 for i in x], [v[1] for v in values], 0.4, label="PyTorch", color="#c4a000")
    ax.set_xticks(list(x), presets, fontsize=8)
    ax.set_ylabel(label)
    if label.startswith("step"):
      ax.set_yscale("log")
    ax.legend(fontsize=8, frameon=False)
  fig.suptitle(f"{device} · {', '.join(dates)}", fontsize=9)
  fig.tight_layout()
  out = io.BytesIO()
  fig.savefig(out, format="svg", metadata={"Date": None})
  plt.close(fig)
  return out.getvalue()


def _slug(text: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _table(rows: list[tuple[Run, dict[str, str]]], against: list[str]) -> list[str]:
  """A headline table: each row's preset, shape, dtype, date and jaxtl's
  step, then the ``against`` columns (numbers, right-aligned)."""
  columns = ["preset", "batch x tokens", "dtype", "date", "step ms", "tokens/s", *against]
  lines = ["| " + " | ".join(columns) + " |", "|---|---|---|---|" + "---:|" * (len(columns) - 4)]
  lines += ["| " + " | ".join(run.date if c == "date" else r[c] for c in columns) + " |"
            for run, r in rows]
  return lines


def render(path: str) -> tuple[str, dict[str, bytes]]:
  """The page's Markdown and its figures (paths relative to docs/)."""
  with open(path, encoding="utf-8") as f:
    runs = parse(f.read())
  figures: dict[str, bytes] = {}
  lines = [
      "# Benchmarks", "",
      "The train step of each preset, timed by `jaxtl benchmark` (real AdamW step,",
      "synthetic batches) beside Hugging Face PyTorch on the same architecture,",
      "batch and optimizer. Every figure here is read from",
      "`launch/benchmark_results.md`, which each run appends to with its date, device,",
      "versions and command; this page is rebuilt from it. Why the numbers are what",
      "they are, and what changed them: [performance notes](studies/performance.md);",
      "the command's flags: [command line](reference/cli.md#jaxtl-benchmark).", "",
      "Add a row:", "", "```bash",
      "jaxtl benchmark --presets=minilm_cls,gpt2_small --torch "
      "--results=launch/benchmark_results.md", "```", "",
      "## Newest against PyTorch, per device", ""]
  for device, rows in headline(runs).items():
    name = f"_generated/bench_{_slug(device)}.svg"
    figures[name] = plot(device, rows)
    lines += [f"### {device}", "", f"![{device}: jaxtl and PyTorch per preset]({name})", "",
              *_table(rows, ["MFU", "PyTorch tokens/s", "PyTorch MFU", "jaxtl / PyTorch"]),
              ""]
  keras = headline(runs, "KerasHub")
  if keras:
    lines += ["## Newest against KerasHub, per device", "",
              "KerasHub's task for the same architecture on the same JAX "
              "(`--keras`), trained by its own `train_on_batch`.", ""]
  for device, rows in keras.items():
    lines += [f"### {device}: KerasHub", "",
              *_table(rows, ["KerasHub step ms", "KerasHub tokens/s", "jaxtl / KerasHub"]),
              ""]
  lines += ["## Every run, newest first", "",
            "As recorded, with the notes written beside them.", ""]
  for number, run in reversed(list(enumerate(runs, 1))):
    lines += [f"### Run {number}: {run.date}, {device_name(run.device) or run.device}", "",
              f"{run.device} · {run.versions}", ""]
    lines += [f"*Note on the runs from here on:* {note}\n" for note in run.notes]
    lines += [line for line in run.text if line.strip() or lines[-1].strip()] + [""]
  return "\n".join(lines), figures
