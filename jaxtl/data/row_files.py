"""Rows of tabular files as ``(line, fields)`` pairs, one small reader per format.

Labeled-task files (``jaxtl.tasks.file_task``), prediction inputs
(``jaxtl.tasks.rows``) and JSON-lines corpora (``jaxtl.data.sources``) all
read rows through :func:`read_rows`, so a CSV or JSON quirk is handled
once. A reader is ``(path, report) -> iterator of (line, dict)``: ``line``
is the 1-based line where the row starts (a Parquet row's 1-based row
number), and ``report(where, reason)`` receives each row that cannot be
read; it raises or records (``tasks.examples.BadRows``), and the reader
goes on with the next row. Another file format plugs in as
one more entry of ``READERS``; Hugging Face datasets, which are not files,
come in through ``jaxtl.data.hf_datasets.records`` in the file task.

CSV and TSV are read with the standard library's ``csv`` module (quoted
fields may hold commas, tabs, quotes and newlines); ``tsv_unquoted`` is
IANA TSV, where quotes are ordinary characters (GLUE's files hold stray
``"``). Bytes that are not UTF-8 are reported per row, not as a crash
somewhere in the middle of a file.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

Row = tuple[int, dict[str, Any]]
Report = Callable[[str, str], None]  # (where, reason)

_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
               ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def raise_report(where: str, reason: str) -> None:
  """The strict ``report``: the first bad row is an error."""
  raise ValueError(f"{where}: {reason}")


def format_of(path: str, given: str = "") -> str:
  """``given``, else the format the extension names (``.gz`` looked through);
  "" when neither says."""
  if given:
    if given not in READERS:
      raise ValueError(f"unknown format {given!r}; known: {', '.join(READERS)}")
    return given
  stem = path[:-3] if path.endswith(".gz") else path
  return _EXTENSIONS.get(os.path.splitext(stem)[1].lower(), "")


def _open_bytes(path: str) -> IO[bytes]:
  if path == "-":
    return sys.stdin.buffer
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _display(path: str) -> str:
  return "<stdin>" if path == "-" else path


def _has_undecodable(values: Any) -> bool:
  """Bytes that were not UTF-8 survive decoding as lone surrogates."""
  return any(any("\udc80" <= ch <= "\udcff" for ch in v) for v in values)


def _table_rows(path: str, report: Report, *, delimiter: str, quoting: int,
                columns: Sequence[str] = ()) -> Iterator[Row]:
  """CSV-like rows keyed by the header line (or by ``columns``, for a file
  without one: GLUE's CoLA); ragged rows are reported."""
  name = _display(path)
  raw = _open_bytes(path)
  # utf-8-sig drops a byte-order mark; surrogateescape keeps bad bytes
  # until the row holding them is known.
  text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape",
                          newline="")
  # The csv module refuses fields over 128 KiB by default, with an error that
  # names no file; a long document is a valid text (tokenization cuts it).
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
  try:
    reader = csv.reader(text, delimiter=delimiter, quoting=quoting)
    header = list(columns) or next(reader, None)
    if not header:
      raise ValueError(f"{name}:1: no header line naming the columns")
    if _has_undecodable(header):
      raise ValueError(f"{name}:1: header is not valid utf-8")
    line = reader.line_num
    for values in reader:
      start, line = line + 1, reader.line_num
      if not any(v.strip() for v in values):
        continue
      if len(values) != len(header):
        report(f"{name}:{start}", f"{len(values)} columns, the header has "
               f"{len(header)} ({header})")
      elif _has_undecodable(values):
        report(f"{name}:{start}", "not valid utf-8")
      else:
        yield start, dict(zip(header, values))
  finally:
    if raw is not sys.stdin.buffer:
      text.close()


def _jsonl_rows(path: str, report: Report) -> Iterator[Row]:
  """One JSON object per line, each line decoded (and reported) alone."""
  name = _display(path)
  f = _open_bytes(path)
  try:
    for lineno, raw in enumerate(f, start=1):
      where = f"{name}:{lineno}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        report(where, f"not valid utf-8 ({e.reason})")
        continue
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        report(where, f"malformed JSON: {e}")
        continue
      if not isinstance(row, dict):
        report(where, f"expected a JSON object, got {type(row).__name__}")
        continue
      yield lineno, row
  finally:
    if f is not sys.stdin.buffer:
      f.close()


def _parquet_rows(path: str, report: Report) -> Iterator[Row]:
  """Parquet rows by 1-based row number, read a record batch at a time."""
  del report  # Parquet is typed: a row either reads or the file is broken.
  if path == "-":
    raise ValueError("Parquet cannot be read from stdin: name the file")
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"{path}: reading Parquet needs pyarrow "
                      "(pip install pyarrow)") from e
  number = 0
  for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
    for row in batch.to_pylist():
      number += 1
      yield number, row


TABLES = {"csv": (",", csv.QUOTE_MINIMAL), "tsv": ("\t", csv.QUOTE_MINIMAL),
          "tsv_unquoted": ("\t", csv.QUOTE_NONE)}  # format: (delimiter, quoting)

READERS: dict[str, Callable[..., Iterator[Row]]] = {
    **{fmt: functools.partial(_table_rows, delimiter=d, quoting=q)
       for fmt, (d, q) in TABLES.items()},
    "jsonl": _jsonl_rows,
    "parquet": _parquet_rows,
}


def where(path: str, fmt: str, line: int) -> str:
  """How messages name a row: ``file:line``, or ``file:row N`` for Parquet."""
  return f"{_display(path)}:row {line}" if fmt == "parquet" else f"{_display(path)}:{line}"


def read_rows(path: str, fmt: str = "", report: Report = raise_report,
              columns: Sequence[str] = ()) -> Iterator[Row]:
  """``(line, fields)`` for every non-blank row of ``path`` (``-``: stdin).

  Args:
    path: The file; gzipped when its name ends in ``.gz`` (not Parquet).
    fmt: One of ``READERS``; "" takes it from the extension.
    report: Called as ``report(where, reason)`` for each unreadable row.
    columns: A table's column names when it has no header line.
  """
  fmt = format_of(path, fmt)
  if not fmt:
    raise ValueError(f"{path}: cannot tell the format from the name; give one of "
                     f"{', '.join(READERS)}")
  if path != "-" and not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path}")
  if columns:
    if fmt not in TABLES:
      raise ValueError(f"{path}: only tables ({', '.join(TABLES)}) take column "
                       f"names; {fmt} rows name their fields")
    return READERS[fmt](path, report, columns=columns)
  return READERS[fmt](path, report)
