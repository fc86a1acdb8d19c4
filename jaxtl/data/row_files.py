"""Rows of tabular files as ``(line, fields)`` pairs, one small reader per format.

Labeled-task files (``jaxtl.tasks.file_task``), prediction inputs
(``jaxtl.tasks.rows``) and JSON-lines corpora (``jaxtl.data.sources``) all
read rows through :func:`read_rows`, so a CSV or JSON quirk is handled
once. A reader is ``(path, report, *, keep_blank) -> iterator of (line,
dict)``: ``line`` is the 1-based line where the row starts (a Parquet
row's 1-based row number), and ``report(where, reason)`` receives each row
that cannot be read; it raises or records (``tasks.examples.BadRows``),
and the reader goes on with the next row. Blank rows are passed over
(training data), or with ``keep_blank`` are rows too (prediction input,
where every row must come out). Another file format plugs in as one more
entry of ``READERS``; Hugging Face datasets, which are not files, come in
through ``jaxtl.data.hf_datasets.records`` in the file task.

CSV and TSV are read with the standard library's ``csv`` module (quoted
fields may hold commas, tabs, quotes and newlines) in strict mode: a
quote that is never closed would otherwise swallow the rows after it into
one field, so it stops the read, naming the line where that row starts,
even under ``on_error="skip"`` (past it, where rows begin is unknown, and
a skipped count would hide the loss). ``tsv_unquoted`` is IANA TSV, where
quotes are ordinary characters (GLUE's files hold stray ``"``). A header
that names a column twice is refused: a row would keep only the last.
Bytes that are not UTF-8 are reported per row, naming the byte, not as a
crash somewhere in the middle of a file.
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


def _not_text(e: UnicodeDecodeError) -> str:
  """Why bytes are not text, naming the first bad byte (the line says where)."""
  return f"not valid {e.encoding} (byte 0x{e.object[e.start]:02x}: {e.reason})"


def _undecodable(values: Sequence[str]) -> str | None:
  """Why cells decoded with ``surrogateescape`` are not UTF-8, else None:
  each bad byte survived as a lone surrogate, which encodes back to it (a
  newline between cells keeps two cells' bytes from making one character)."""
  try:
    "\n".join(values).encode("utf-8", "surrogateescape").decode("utf-8")
  except UnicodeDecodeError as e:
    return _not_text(e)
  return None


def _check_header(header: Sequence[str], name: str) -> None:
  """A column named twice would leave each row its last cell of that name,
  silently: which one the task meant cannot be told. Unnamed columns (a
  spreadsheet's trailing empty ones) are never read, so they may repeat."""
  seen = set()
  for column in header:
    if column.strip() and column in seen:
      raise ValueError(f"{name}:1: column {column!r} appears twice in the header "
                       f"{header}; rename one")
    seen.add(column)


def _broken_quote(e: csv.Error, line: int, delimiter: str) -> str:
  """Why a table stops at a row whose quotes do not balance, and the fix."""
  fix = 'close each quoted field (a quote inside one is written "")'
  if delimiter == "\t":
    fix += (", or read a TSV whose quotes are plain text as tsv_unquoted "
            "(--config.task.format=tsv_unquoted; jaxtl predict: --input_format=tsv_unquoted)")
  return (f"a quoted field in the row starting here is not closed properly (csv: "
          f"{e}, at line {line}); the rest of the file cannot be read: {fix}")


def _table_rows(path: str, report: Report, *, delimiter: str, quoting: int,
                columns: Sequence[str] = (), keep_blank: bool = False
                ) -> Iterator[Row]:
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
  reader = csv.reader(text, delimiter=delimiter, quoting=quoting, strict=True)
  line = 0  # the line the last row ended on
  try:
    header = list(columns) or next(reader, None)
    if not header:
      raise ValueError(f"{name}:1: no header line naming the columns")
    if not columns:
      _check_header(header, name)
    if reason := _undecodable(header):
      raise ValueError(f"{name}:1: header is {reason}")
    line = reader.line_num
    for values in reader:
      start, line = line + 1, reader.line_num
      if not any(v.strip() for v in values):
        if not keep_blank:
          continue
        values = values or [""] * len(header)  # a blank line: empty cells
      if len(values) != len(header):
        report(f"{name}:{start}", f"{len(values)} columns, the header has "
               f"{len(header)} ({header})")
      elif reason := _undecodable(values):
        report(f"{name}:{start}", reason)
      else:
        yield start, dict(zip(header, values))
  except csv.Error as e:
    raise_report(f"{name}:{line + 1}", _broken_quote(e, reader.line_num, delimiter))
  finally:
    if raw is not sys.stdin.buffer:
      text.close()


def read_lines(path: str, report: Report = raise_report, *, keep_blank: bool = False,
               encoding: str = "utf-8") -> Iterator[tuple[int, str]]:
  """``(line, text)`` of each line of ``path`` (``-``: stdin), without its
  line break or a first line's byte-order mark.

  Each line is decoded alone, so a byte that is not text is reported at
  its line (and costs only that line). Blank lines are passed over unless
  ``keep_blank``; the newline that ends a file makes no line of its own.
  """
  name = _display(path)
  f = _open_bytes(path)
  try:
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode(encoding)
      except UnicodeDecodeError as e:
        report(f"{name}:{lineno}", _not_text(e))
        continue
      if lineno == 1:
        line = line.removeprefix("\ufeff")
      line = line.rstrip("\r\n")
      if keep_blank or line.strip():
        yield lineno, line
  finally:
    if f is not sys.stdin.buffer:
      f.close()


def _jsonl_rows(path: str, report: Report, *, keep_blank: bool = False
                ) -> Iterator[Row]:
  """One JSON object per line, each line decoded (and reported) alone; a
  kept blank line is reported, as it is no object."""
  name = _display(path)
  for lineno, line in read_lines(path, report, keep_blank=keep_blank):
    where = f"{name}:{lineno}"
    if not line.strip():
      report(where, "blank line, not a JSON object: every line is a row; remove it")
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


def _parquet_rows(path: str, report: Report, *, keep_blank: bool = False
                  ) -> Iterator[Row]:
  """Parquet rows by 1-based row number, read a record batch at a time."""
  # Parquet is typed: a row either reads or the file is broken; no row is blank.
  del report, keep_blank
  if path == "-":
    raise ValueError("Parquet cannot be read from stdin: name the file")
  try:  # only Parquet files need Arrow (~50 modules): the data layer loads without it
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
              columns: Sequence[str] = (), *, keep_blank: bool = False
              ) -> Iterator[Row]:
  """``(line, fields)`` for every row of ``path`` (``-``: stdin), in order.

  Args:
    path: The file; gzipped when its name ends in ``.gz`` (not Parquet).
    fmt: One of ``READERS``; "" takes it from the extension.
    report: Called as ``report(where, reason)`` for each unreadable row.
    columns: A table's column names when it has no header line.
    keep_blank: Blank rows are rows too: a table's have empty cells, and a
      blank JSON line is reported (prediction input, where no row may be
      lost); otherwise they are passed over (training data).
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
    return READERS[fmt](path, report, columns=columns, keep_blank=keep_blank)
  return READERS[fmt](path, report, keep_blank=keep_blank)
