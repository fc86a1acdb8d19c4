"""Rows in and out of files for prediction: CSV, TSV, JSON lines, Parquet,
plain text.

Every row is read (and checked) before any is predicted, so a malformed
line fails at once with ``FILE:LINE``, not after an hour of compute. Every
row comes out, in order, blank ones too: a blank line or an empty cell is
an empty text, not a row to drop. Rows keep their own fields, so the
output is the input plus the prediction.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from jaxtl.data import row_files

FORMATS = ("text", *row_files.READERS)
TEXT_FIELD = "text"  # a plain-text line's one field


def format_of(path: str, given: str = "") -> str:
  """The format ``given``, else the one the file's extension names (plain
  text for other names and for stdin, ``-``)."""
  if given == "text":
    return given
  return row_files.format_of(path, given) or "text"


def read_rows(path: str, fmt: str = "") -> list[tuple[int, dict[str, Any]]]:
  """(line number, row) for every row of ``path`` (``-``: stdin), blank
  ones included (the newline that ends the file makes no row).

  CSV and TSV take their field names from the header line; a plain-text
  line is one ``text`` field. The first unreadable row is an error naming
  its line (:mod:`jaxtl.data.row_files`).
  """
  fmt = format_of(path, fmt)
  if fmt != "text":
    return list(row_files.read_rows(path, fmt, keep_blank=True))
  return [(i, {TEXT_FIELD: line})
          for i, line in row_files.read_lines(path, keep_blank=True)]


def fields_of(rows: Iterable[tuple[int, dict[str, Any]]]) -> list[str]:
  """Every field of any row, in first-seen order: an output table's columns
  (JSON-lines rows need not share their fields)."""
  return list(dict.fromkeys(field for _, row in rows for field in row))


def pick(rows: Sequence[tuple[int, dict[str, Any]]], fields: Sequence[str],
         name: str) -> list[list[Any]]:
  """Each row's ``fields``, in order; a missing one names its line (an
  empty one is an empty text)."""
  out = []
  for lineno, row in rows:
    missing = [f for f in fields if row.get(f) is None]
    if missing:
      raise ValueError(f"{name}:{lineno}: no {', '.join(map(repr, missing))} "
                       f"(the row has {sorted(row)}; pick columns with --text_fields)")
    out.append([row[f] for f in fields])
  return out


class Writer:
  """Writes rows as JSON lines, CSV or TSV (by the output's extension;
  stdout, ``-``, gets JSON lines). A table's columns are ``columns`` (every
  input row's fields: a field only later rows have keeps its column) and
  then the first row's others (the prediction's); a row without one leaves
  its cell empty. In a table, a mapping gets a column per key, named as
  pandas' ``json_normalize`` names them (``probabilities.positive``), so a
  spreadsheet can sort by a class; a list (a row's tags) is JSON in its cell.

  A file is written beside ``path`` and takes its name at :meth:`close`, so
  a run stopped halfway (an error, Ctrl-C) leaves the file that was there,
  the input itself when a run writes over it, instead of half a file.
  Used as a context manager it closes on success and discards on an error.
  """

  def __init__(self, path: str, fmt: str = "", columns: Sequence[str] = ()):
    self.fmt = "jsonl" if path == "-" and not fmt else format_of(path, fmt)
    if self.fmt not in ("csv", "tsv"):  # text, Parquet: rows need fields
      self.fmt = "jsonl"
    self.path, self._partial = path, None
    if path == "-":
      self.f = sys.stdout
    else:
      folder, name = os.path.split(os.path.abspath(path))
      os.makedirs(folder, exist_ok=True)  # --output=preds/dev.jsonl makes preds/
      # Opened as the output itself would be (its permissions, not mkstemp's 0600).
      self._partial = os.path.join(folder, f".{name}.{os.getpid()}.partial")
      self.f = open(self._partial, "w", encoding="utf-8", newline="")
    self.columns = list(columns)
    self._table = None

  def __enter__(self) -> "Writer":
    return self

  def __exit__(self, error: type[BaseException] | None, *_: Any) -> None:
    if error is None:
      self.close()
    else:
      self.discard()

  def write(self, row: dict[str, Any]) -> None:
    if self.fmt == "jsonl":
      self.f.write(json.dumps(row, ensure_ascii=False) + "\n")
      return
    row = dict(_columns(row))
    if self._table is None:
      self._table = csv.DictWriter(self.f, list(dict.fromkeys([*self.columns, *row])),
                                   delimiter="\t" if self.fmt == "tsv" else ",")
      self._table.writeheader()
    self._table.writerow({k: v if isinstance(v, (str, int, float)) or v is None
                          else json.dumps(v, ensure_ascii=False)
                          for k, v in row.items()})

  def close(self) -> None:
    """Finishes the output: the written file takes ``path``'s name."""
    if self.f is sys.stdout:
      self.f.flush()
      return
    self.f.close()
    os.replace(self._partial, self.path)

  def discard(self) -> None:
    """Drops what was written; ``path`` keeps what it held before."""
    if self.f is sys.stdout:
      self.f.flush()
      return
    self.f.close()
    os.remove(self._partial)


def _columns(row: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
  """A row's (column, value) pairs for a table: a mapping's keys become
  columns of their own (``probabilities.positive``)."""
  for key, value in row.items():
    if isinstance(value, Mapping):
      yield from ((f"{key}.{sub}", v) for sub, v in value.items())
    else:
      yield key, value
