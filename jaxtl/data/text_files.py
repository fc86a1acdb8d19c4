"""Texts read from local files: plain text, JSON lines, a TSV column, a
Parquet column, each streamed as it is consumed (a corpus may be larger
than host memory), each error naming the file and its 1-based line (or
row), so a bad row in a large file is quick to find. Which file a corpus
reads, and how, is :mod:`jaxtl.data.sources`'s."""

from __future__ import annotations

import csv
import gzip
import io
import os
from collections.abc import Iterator, Mapping
from typing import Any

from jaxtl.data import row_files

PathLike = str | os.PathLike[str]


def check_file(path: PathLike) -> str:
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path}")
  return path


def _open_text(path: str, encoding: str, newline: str | None = None
               ) -> io.TextIOBase:
  """Opens a text file, decompressing it on the fly if it ends in .gz."""
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding=encoding, newline=newline)
  return open(path, "r", encoding=encoding, newline=newline)


def _decode_error(path: str, encoding: str, e: UnicodeDecodeError
                  ) -> ValueError:
  """Builds a decode error that names the file and first bad line."""
  where = path
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      try:
        raw.decode(encoding)
      except UnicodeDecodeError:
        where = f"{path}:{lineno}"
        break
      except LookupError:
        break
  return ValueError(
      f"{where}: not valid {encoding} ({e.reason}); pass the file's "
      "encoding, e.g. encoding='latin-1'")


def read_text(path: PathLike, *, encoding: str = "utf-8",
              paragraphs: bool = False) -> list[str]:
  """Reads a plain-text file as documents (the list of `iter_text`)."""
  return list(iter_text(path, encoding=encoding, paragraphs=paragraphs))


def iter_text(path: PathLike, *, encoding: str = "utf-8",
              paragraphs: bool = False) -> Iterator[str]:
  """Reads a plain-text file as documents, as they are consumed.

  Args:
    path: The file (may end in .gz).
    encoding: Text encoding of the file.
    paragraphs: If True the whole file is one document (tiny Shakespeare);
      otherwise every non-blank line is a document (WikiText), kept as it is
      apart from the line break.

  Yields:
    The documents.
  """
  path = check_file(path)
  try:
    with _open_text(path, encoding) as f:
      if paragraphs:
        text = f.read()
        if text.strip():
          yield text
        return
      for line in f:
        if line.strip():
          yield line.rstrip("\r\n")
  except UnicodeDecodeError as e:
    raise _decode_error(path, encoding, e) from e


def text_field(row: Mapping[str, Any], field: str, where: str) -> str:
  """``row[field]``, checked to be a string; errors start with ``where``."""
  if field not in row:
    raise ValueError(f"{where}: field {field!r} missing (row has {sorted(row)})")
  text = row[field]
  if not isinstance(text, str):
    raise ValueError(f"{where}: field {field!r} is {type(text).__name__}, not "
                     "a string")
  return text


def read_jsonl(path: PathLike, *, field: str = "text") -> list[str]:
  """One string field of each row of a JSON-lines file (`iter_jsonl`'s list)."""
  return list(iter_jsonl(path, field=field))


def iter_jsonl(path: PathLike, *, field: str = "text") -> Iterator[str]:
  """Reads one string field from each row of a JSON-lines file, lazily.

  Args:
    path: The file; gzipped when its name ends in .gz.
    field: The field holding the text.

  Yields:
    The rows' texts, in file order.

  Raises:
    ValueError: naming the file and line, for a line that is not UTF-8 or
      not a JSON object, a missing field, or a text that is not a non-empty
      string.
  """
  path = check_file(path)
  # The one JSON-lines reader: labeled tasks read their rows through it too.
  for lineno, row in row_files.read_rows(path, "jsonl"):
    text = text_field(row, field, f"{path}:{lineno}")
    if not text.strip():
      raise ValueError(f"{path}:{lineno}: field {field!r} is empty")
    yield text


def read_tsv_column(path: PathLike, field: str, *, encoding: str = "utf-8-sig"
                    ) -> list[str]:
  """One column of a tab-separated file (`iter_tsv_column`'s list)."""
  return list(iter_tsv_column(path, field, encoding=encoding))


def iter_tsv_column(path: PathLike, field: str, *, encoding: str = "utf-8-sig"
                    ) -> Iterator[str]:
  """Reads the column ``field`` of a tab-separated file such as a GLUE task,
  lazily.

  The first line names the columns (it is not a text). Quotes are not
  special (GLUE sentences contain stray `"`), and the default encoding drops
  the BOM that starts MRPC's header.

  Args:
    path: The file (may end in .gz).
    field: The header's name for the column.
    encoding: Text encoding of the file.

  Yields:
    The column's values, one per data row (blank lines are skipped).
  """
  path = check_file(path)
  try:
    with _open_text(path, encoding, newline="") as f:
      reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
      header = next(reader, None)
      if header is None:  # An empty file: no texts.
        return
      if field not in header:
        raise ValueError(f"{path}: no column {field!r}; the header (the first "
                         f"line) has {header}")
      index = header.index(field)
      for lineno, row in enumerate(reader, start=2):
        if not row:  # Blank line.
          continue
        if index >= len(row):
          raise ValueError(f"{path}:{lineno}: row has {len(row)} columns, "
                           f"column {field!r} needs {index + 1}")
        yield row[index]
  except UnicodeDecodeError as e:
    raise _decode_error(path, encoding, e) from e


def iter_parquet_column(path: str, field: str) -> Iterator[str]:
  """One string column of a Parquet file, a record batch at a time."""
  # only Parquet corpora need Arrow (~50 modules): the data layer loads without it
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  try:
    table = pq.ParquetFile(path)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{path}: not a readable Parquet file ({e})") from e
  if field not in table.schema_arrow.names:
    raise ValueError(f"{path}: no column {field!r}; it has "
                     f"{table.schema_arrow.names}")
  row = 0
  for batch in table.iter_batches(columns=[field], batch_size=4096):
    for text in batch.column(0).to_pylist():
      if not isinstance(text, str):
        raise ValueError(f"{path}:row {row}: column {field!r} is "
                         f"{type(text).__name__}, not a string")
      if text.strip():
        yield text
      row += 1
