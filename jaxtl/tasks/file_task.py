"""Labeled tasks described by data, not code: which file, which fields, which kind.

A :class:`FileTask` says where a task's texts and labels are in a row; the
rows come from :func:`jaxtl.data.row_files.read_rows` (CSV, TSV, JSON lines,
Parquet, gzipped or not), so ``configs/finetune.py:task=files`` fine-tunes on
a user's own files with no Python, and the built-in tasks whose files are
plain tables (GLUE, IMDB: ``readers.py``) are entries of the same mechanism.

Class labels may be strings or integers of any range: the label set is the
config's ``labels`` or, read from train, sorted (numerically when every
label is an integer, so 1..10 keeps its order), and becomes the class ids
saved with the model (``task.json``), so predictions come back as the
user's own label names. A label is its text, stripped, and an integer its
decimal digits (7 and "7" are one class); nothing else is normalised, so
one number spelled two ways (1 and "01", "1" and "1.0") is an error at the
second spelling rather than two classes. Every bad row is an error naming
file and line, or with ``on_error="skip"`` is dropped and recorded.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from jaxtl.data import hf_datasets, row_files
from jaxtl.tasks.config import TaskConfig
from jaxtl.tasks.examples import BadRows, Examples

KINDS = ("classification", "regression", "token_classification", "text_to_text",
         "generation")
UNLABELLED = ("regression", "generation")  # targets are scores or texts: no label set
_INTEGER = re.compile(r"-?\d+")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class FileTask:
  """Where a labeled task's inputs and labels are in each row.

  Attributes:
    text_fields: The text field, or two for sentence pairs; for tagging, the
      one field holding the list of words.
    label_field: The class label, score, (tagging) list of tags, or
      (generation) target text, or a list of reference texts whose first is
      the training target.
    kind: classification | regression | token_classification |
      text_to_text (classification labels, written by a T5 decoder) |
      generation (free output text, written by a T5 or GPT-2).
    format: A ``row_files.READERS`` key; "" takes it from each file's name.
    labels: The label values in class-id order; empty: every label in
      train, sorted. Given, a label outside them is a bad row.
    label_names: What predictions call each class (default: ``labels``),
      e.g. GLUE's "0"/"1" shown as "negative"/"positive".
    score_range: Regression: the allowed [low, high] of scores, if any.
    columns: A table's column names when it has no header line.
    hf: With ``format="hf"``, the Hugging Face dataset
      (:class:`jaxtl.data.hf_datasets.HFSpec` fields); a split's "path" is
      then the dataset's split name.
  """
  text_fields: tuple[str, ...]
  label_field: str
  kind: str = "classification"
  format: str = ""
  labels: tuple[str, ...] = ()
  label_names: tuple[str, ...] = ()
  score_range: tuple[float, float] | None = None
  columns: tuple[str, ...] = ()
  hf: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"task kind {self.kind!r} cannot be read from files; known: "
                       f"{', '.join(KINDS)}")
    wanted = (1,) if self.kind == "token_classification" else (1, 2)
    if len(self.text_fields) not in wanted or not all(self.text_fields):
      raise ValueError(f"text_fields={self.text_fields}: name the text field, two "
                       "for sentence pairs (tagging: the one field of words)")
    if not self.label_field:
      raise ValueError("label_field is empty: name the field holding the labels")
    if len(set(self.columns)) != len(self.columns):
      raise ValueError(f"columns={self.columns} name a column twice: a row would "
                       "keep only its last cell of that name")
    if self.label_names and len(self.label_names) != len(self.labels):
      raise ValueError(f"label_names {self.label_names} need the {len(self.labels)} "
                       f"labels {self.labels} they rename")


def label_key(value: Any) -> str | None:
  """A class label as text; None for a non-label.

  A string is its stripped text and an integer its decimal digits, so 7
  and "7" are one class; "07" and "7.0" keep their spelling (and are
  refused beside "7" by :func:`read_split`: the same number spelled twice
  is more likely a mistake than two classes).
  """
  if isinstance(value, bool):
    return None
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  if isinstance(value, str) and value.strip():
    return value.strip()
  return None


def sorted_labels(keys: Sequence[str]) -> tuple[str, ...]:
  """Distinct labels in a fixed order: by value when all are integers
  (1, 2, 10), else by text; the order of class ids, whatever the row order."""
  distinct = set(keys)
  if all(_INTEGER.fullmatch(k) for k in distinct):
    return tuple(sorted(distinct, key=int))
  return tuple(sorted(distinct))


def _number(key: str) -> decimal.Decimal | None:
  """The number a label spells ("01", "1.0" and "1e0" all spell 1), if any."""
  return decimal.Decimal(key) if _NUMBER.fullmatch(key) else None


def _first_spellings(keys: Iterable[str]) -> list[str]:
  """Distinct labels, each number as first spelled: a later "01" beside
  "1" is then no class, and its row is refused by :func:`_class_ids`."""
  spelling = {}
  for key in keys:
    number = _number(key)
    spelling.setdefault(key if number is None else number, key)
  return list(spelling.values())


def _words(value: Any) -> list[str] | None:
  """A list of non-empty strings (a table cell: whitespace-separated)."""
  if isinstance(value, str):
    value = value.split()
  if isinstance(value, (list, tuple)) and value and all(
      isinstance(w, str) and w.strip() for w in value):
    return list(value)
  return None


def _inputs(task: FileTask, row: dict[str, Any]) -> tuple[list[Any], Any] | str:
  """(texts or [words], raw label) of a row, or why it is bad."""
  missing = [f for f in (*task.text_fields, task.label_field) if row.get(f) is None]
  if missing:
    return f"no field {', '.join(map(repr, missing))} (the row has {sorted(row)})"
  if task.kind == "token_classification":
    words, tags = _words(row[task.text_fields[0]]), _words(row[task.label_field])
    if words is None:
      return f"field {task.text_fields[0]!r} is not a non-empty list of words"
    if tags is None or len(tags) != len(words):
      return (f"field {task.label_field!r} must hold one tag per word "
              f"({len(words)} words)")
    return [words], tags
  texts = [row[f] for f in task.text_fields]
  for field, text in zip(task.text_fields, texts):
    if not isinstance(text, str):
      return f"field {field!r} is not text: {text!r}"
    if not text.strip():
      return f"empty text in field {field!r}"
  return texts, row[task.label_field]


# A header read as one column, split by what it holds: what to do instead.
_SEPARATORS = (("\t", "tabs: --config.task.format=tsv (or a .tsv name)"),
               (",", "commas: --config.task.format=csv (or a .csv name)"),
               (";", "semicolons: save it with commas (CSV) or tabs (TSV)"),
               ("|", "bars: save it with commas (CSV) or tabs (TSV)"))


def _check_header(task: FileTask, path: str, row: dict[str, Any]) -> None:
  """A table's columns are the same on every row: a missing one is one
  error about the header, not one per row."""
  for field in (*task.text_fields, task.label_field):
    if field not in row:
      raise ValueError(f"{path}:1: no column {field!r}; the header has {list(row)}"
                       f"{_separator_hint(list(row), field)}")


def _separator_hint(header: list[str], field: str) -> str:
  """What to do when the header is one column whose name holds ``field``
  among others: the file has another separator than its format's (a
  semicolon CSV from a spreadsheet, a TSV named .csv); else ""."""
  if len(header) != 1:
    return ""
  for sep, fix in _SEPARATORS:
    if field in (parts := header[0].split(sep)) and len(parts) > 1:
      return f"; its columns are separated by {fix}"
  return ""


def _score(task: FileTask, value: Any) -> float | str:
  """A regression target, or why it is not one."""
  try:
    score = float(value) if not isinstance(value, bool) else math.nan
  except (TypeError, ValueError):
    return f"score {value!r} is not a number"
  if not math.isfinite(score):
    return f"score {value!r} is not a finite number"
  low, high = task.score_range or (-math.inf, math.inf)
  if not low <= score <= high:
    return f"score {score} outside [{low}, {high}]"
  return score


def _references(value: Any) -> tuple[str, ...] | str:
  """A generation target: a text, or a non-empty list of texts (several
  references; the first is trained on); or why it is not one."""
  texts = value if isinstance(value, list) else [value]
  if texts and all(isinstance(t, str) and t.strip() for t in texts):
    return tuple(t.strip() for t in texts)
  return f"target {value!r} is not a non-empty text or list of texts"


def _class_ids(raw: Any, ids: dict[str, int]) -> int | list[int] | str:
  """Class (or per-word tag) ids of a raw label, or why it has none."""
  values = raw if isinstance(raw, list) else [raw]
  out = []
  for value in values:
    key = label_key(value)
    if key not in ids:
      return _unknown_label(value, key, ids)
    out.append(ids[key])
  return out if isinstance(raw, list) else out[0]


def _unknown_label(value: Any, key: str | None, ids: dict[str, int]) -> str:
  """Why a label has no class id, naming the class it re-spells, if any."""
  if key is None:
    return f"label {value!r} is not a class name or integer"
  number = _number(key)
  same = [k for k in ids if number is not None and _number(k) == number]
  if same:
    return (f"label {value!r} is the label {same[0]!r} spelled another way; "
            "write each class one way")
  return f"unknown label {value!r}; the labels are {tuple(ids)}"


def _label_set(task: FileTask, parsed: list[tuple[str, list[Any], Any]]
               ) -> tuple[str, ...]:
  """The given labels, else every readable label of ``parsed`` (train), sorted."""
  if task.labels:
    return tuple(label_key(v) or str(v) for v in task.labels)
  keys = [label_key(v) for _, _, raw in parsed
          for v in (raw if isinstance(raw, list) else [raw])]
  return sorted_labels(_first_spellings(k for k in keys if k is not None))


def read_split(task: FileTask, path: str, labels: Sequence[str] | None = None, *,
               on_error: str = "raise") -> Examples:
  """Reads one split of a file task.

  Args:
    task: Which fields hold what.
    path: The file (format from ``task.format`` or its name).
    labels: The label set in class-id order (train's, for dev and test);
      None: ``task.labels`` or, as for train, every label in this file.
    on_error: "raise" on a bad row, or "skip" it and record it.

  Returns:
    The examples, each with its ``file:line``.
  """
  bad = BadRows(on_error)
  parsed = []  # (where, texts or [words], raw label)
  for where, row in _rows(task, path, bad):
    if not parsed and task.format != HF and row_files.format_of(
        path, task.format) in row_files.TABLES:
      _check_header(task, path, row)
    got = _inputs(task, row)
    if isinstance(got, str):
      bad.bad(where, got)
    else:
      parsed.append((where, *got))
  unlabelled = task.kind in UNLABELLED
  if not unlabelled and labels is None:
    labels = _label_set(task, parsed)
  ids = {key: i for i, key in enumerate(labels or ())}
  target_of = {"regression": lambda raw: _score(task, raw),
               "generation": _references}.get(task.kind, lambda raw: _class_ids(raw, ids))
  kept, targets = [], []
  for where, inputs, raw in parsed:
    target = target_of(raw)
    if isinstance(target, str):
      bad.bad(where, target)
    else:
      kept.append((where, inputs))
      targets.append(target)
  return _examples(task, path, kept, targets,
                   None if unlabelled else tuple(task.label_names or labels), bad)


HF = "hf"  # FileTask.format of a Hugging Face dataset
HF_FLAGS = "--config.task.hf"  # what a message about that dataset tells a user to set


def _rows(task: FileTask, path: str, bad: BadRows) -> Iterator[tuple[str, dict[str, Any]]]:
  """(where, row) of one split: a file's rows, or a Hugging Face dataset's
  split ``path`` (``hf_datasets.records``: "glue/qnli train row 17")."""
  if task.format == HF:
    yield from hf_datasets.records({**dict(task.hf), "flags": HF_FLAGS}, path)
    return
  fmt = row_files.format_of(path, task.format)
  for line, row in row_files.read_rows(path, fmt, bad.bad, task.columns):
    yield row_files.where(path, fmt, line), row


def _examples(task: FileTask, path: str, kept: list[tuple[str, list[Any]]],
              targets: list[Any], names: tuple[str, ...] | None,
              bad: BadRows) -> Examples:
  if not kept:
    raise ValueError(f"{path}: no usable rows ({len(bad.skipped)} bad)")
  lines = [where for where, _ in kept]
  if task.kind == "token_classification":
    words = [inputs[0] for _, inputs in kept]
    return Examples([" ".join(w) for w in words], targets, names, words=words,
                    path=path, skipped_rows=bad.skipped, lines=lines)
  pairs = [inputs[1] for _, inputs in kept] if len(task.text_fields) == 2 else None
  return Examples([inputs[0] for _, inputs in kept], targets, names, text_pairs=pairs,
                  path=path, skipped_rows=bad.skipped, lines=lines)


def train_labels(task: FileTask, train: Examples) -> tuple[str, ...] | None:
  """The label keys dev and test are read against (train's class order)."""
  if task.kind in UNLABELLED:
    return None
  return tuple(label_key(v) or str(v) for v in task.labels) or train.label_names


def from_config(task: TaskConfig) -> FileTask:
  """The ``FileTask`` of ``config.task`` (``task=files``). A Hugging Face
  dataset's ClassLabel names are its class order unless ``task.labels``
  gives one (its authors' ids, not the sorted names)."""
  labels = tuple(str(v) for v in task.labels)
  hf = ()
  if task.format == HF:
    hf = tuple((k, str(v)) for k, v in dataclasses.asdict(task.hf).items() if v)
    if not task.hf.name:
      raise ValueError("task.format=hf needs --config.task.hf.name (a Hub dataset "
                       "such as glue, with task.hf.subset=qnli, or a save_to_disk "
                       "folder)")
    if not labels and task.kind not in UNLABELLED:
      labels = hf_datasets.label_names({**dict(hf), "flags": HF_FLAGS},
                                       task.train or "train", task.label_field) or ()
  return FileTask(text_fields=tuple(task.text_fields), label_field=task.label_field,
                  kind=task.kind, format=task.format, labels=labels,
                  label_names=tuple(task.label_names), hf=hf)


def load_splits(task: TaskConfig, seed: int) -> dict[str, Examples | None]:
  """train / dev / test of ``config.task`` (``task=files``).

  dev and test are files, or held out of train: ``test_fraction`` first,
  then ``dev_fraction`` of the rest (a share of 0 and no file: no such
  split; without test, dev is reported; without dev, the last epoch is the
  model). Hold-outs are drawn with ``seed``.
  """
  if not task.train and task.format != HF:
    raise ValueError("task=files needs --config.task.train=PATH (and dev/test "
                     "files, or task.dev_fraction / task.test_fraction)")
  spec = from_config(task)
  train = read_split(spec, task.train or "train", on_error=task.on_error)
  labels = train_labels(spec, train)
  read = lambda path: read_split(spec, path, labels, on_error=task.on_error)
  test = read(task.test) if task.test else None
  if test is None and task.test_fraction:
    train, test = train.split_off(task.test_fraction, seed + 1)
  dev = read(task.dev) if task.dev else None
  if dev is None and task.dev_fraction:
    train, dev = train.split_off(task.dev_fraction, seed)
  return {"train": train, "dev": dev, "test": test if test is not None else dev}
