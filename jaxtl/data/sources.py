"""Readers that turn a dataset split into a stream of texts.

A corpus may be larger than host memory, so every reader is a generator
that reads its files as they are consumed (`iter_texts`); `load_texts` is
the list for the small splits that want one. Tokenization and packing
happen later (jaxtl.data.row_store). Errors name the file and 1-based line
so a bad row in a large file is quick to find.
TFDS datasets are read by :mod:`jaxtl.data.tfds_reader`, which alone
imports TensorFlow, and only when a source asks for it.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from jaxtl.data import mixtures, network, row_files, tfds_reader

DATA_DIR_ENV = network.DATA_DIR_ENV
_DATA_DIR_PLACEHOLDER = "{data_dir}"

PathLike = str | os.PathLike[str]


def resolve_data_dir(flag_value: str | None = None) -> str | None:
  """Returns the data directory: the flag, else $JAXTL_DATA_DIR, else None."""
  if flag_value:
    return flag_value
  return os.environ.get(DATA_DIR_ENV) or None


def require_data_dir(flag_value: str | None = None) -> str:
  """Like `resolve_data_dir`, but fails clearly when no directory is set."""
  data_dir = resolve_data_dir(flag_value)
  if data_dir is None:
    raise ValueError(
        f"no data directory: set the environment variable {DATA_DIR_ENV} "
        "(or pass a data_dir flag) to the folder holding the datasets")
  return data_dir


def _check_file(path: PathLike) -> str:
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
  path = _check_file(path)
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


def read_jsonl(path: PathLike, *, field: str = "text",
               filter: Mapping[str, Any] | None = None  # pylint: disable=redefined-builtin
               ) -> list[str]:
  """One string field of each row of a JSON-lines file (`iter_jsonl`'s list)."""
  return list(iter_jsonl(path, field=field, filter=filter))


def iter_jsonl(path: PathLike, *, field: str = "text",
               filter: Mapping[str, Any] | None = None  # pylint: disable=redefined-builtin
               ) -> Iterator[str]:
  """Reads one string field from each row of a JSON-lines file, lazily.

  Args:
    path: The file; gzipped when its name ends in .gz.
    field: The field holding the text.
    filter: Keep only rows whose values equal these (e.g. {"label": 1}).

  Yields:
    The texts of the kept rows, in file order.

  Raises:
    ValueError: naming the file and line, for a line that is not UTF-8 or
      not a JSON object, a missing field, or a text that is not a non-empty
      string.
  """
  path = _check_file(path)
  conditions = list((filter or {}).items())
  # The one JSON-lines reader: labeled tasks read their rows through it too.
  for lineno, row in row_files.read_rows(path, "jsonl"):
    keep = True
    for key, value in conditions:
      if key not in row:
        raise ValueError(
            f"{path}:{lineno}: filter field {key!r} missing from row")
      if row[key] != value:
        keep = False
        break
    if not keep:
      continue
    text = text_field(row, field, f"{path}:{lineno}")
    if not text.strip():
      raise ValueError(f"{path}:{lineno}: field {field!r} is empty")
    yield text


def read_tsv_column(path: PathLike, column: int | str, *, header: bool = True,
                    encoding: str = "utf-8-sig") -> list[str]:
  """One column of a tab-separated file (`iter_tsv_column`'s list)."""
  return list(iter_tsv_column(path, column, header=header, encoding=encoding))


def iter_tsv_column(path: PathLike, column: int | str, *, header: bool = True,
                    encoding: str = "utf-8-sig") -> Iterator[str]:
  """Reads one column of a tab-separated file such as a GLUE task, lazily.

  Quotes are not special (GLUE sentences contain stray `"`), and the default
  encoding drops the BOM that starts MRPC's header.

  Args:
    path: The file.
    column: 0-based index, or a header name (needs `header=True`).
    header: Whether the first line names the columns (it is skipped).
    encoding: Text encoding of the file.

  Yields:
    The column's values, one per data row.
  """
  path = _check_file(path)
  if isinstance(column, str) and not header:
    raise ValueError(
        f"{path}: column {column!r} given by name but header=False")
  if isinstance(column, int) and column < 0:
    raise ValueError(f"column index must be >= 0, got {column}")
  try:
    with _open_text(path, encoding, newline="") as f:
      reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
      index = column if isinstance(column, int) else -1
      for lineno, row in enumerate(reader, start=1):
        if lineno == 1 and header:
          if isinstance(column, str):
            if column not in row:
              raise ValueError(f"{path}: no column {column!r}; the header "
                               f"has {row}")
            index = row.index(column)
          continue
        if not row:  # Blank line.
          continue
        if index >= len(row):
          raise ValueError(f"{path}:{lineno}: row has {len(row)} columns, "
                           f"column {column!r} needs {index + 1}")
        yield row[index]
  except UnicodeDecodeError as e:
    raise _decode_error(path, encoding, e) from e


def expand_path(path: Any) -> str:
  """Substitutes the data directory into a configured path."""
  path = os.fspath(path)
  if _DATA_DIR_PLACEHOLDER in path:
    path = path.replace(_DATA_DIR_PLACEHOLDER, require_data_dir())
  return path


def _split_files(source: Mapping[str, Any], split: str) -> list[str]:
  files = source.get("files")
  if not isinstance(files, Mapping) or not files:
    raise ValueError(f"source of kind {source['kind']!r} needs 'files', a "
                     "mapping from split name to paths")
  if split not in files:
    raise ValueError(f"unknown split {split!r}; the source has "
                     f"{sorted(files)}")
  paths = files[split]
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  return [expand_path(p) for p in paths]


def _renamed_split(source: Mapping[str, Any], split: str) -> str:
  """The source's name for ``split``: its optional ``splits`` renaming (e.g.
  validation -> train[:5%]), else the split itself."""
  splits = source.get("splits")
  if splits is None:
    return split
  if split not in splits:
    raise ValueError(f"unknown split {split!r}; the source has "
                     f"{sorted(splits)}")
  return splits[split]


def _iter_tfds(source: Mapping[str, Any], split: str) -> Iterator[str]:
  data_dir = source.get("data_dir")  # "" or None: TFDS's default.
  manual_dir = source.get("manual_dir")  # "" or None: download.
  yield from tfds_reader.iter_tfds(
      source["name"], _renamed_split(source, split),
      data_dir=expand_path(data_dir) if data_dir else None,
      manual_dir=expand_path(manual_dir) if manual_dir else None,
      field=source.get("field", "text"))


def _iter_hf(source: Mapping[str, Any], split: str) -> Iterator[str]:
  """A Hugging Face dataset's text column (jaxtl.data.hf_datasets), ``field``.

  Blank texts are left out (WikiText on the Hub has an empty row between
  paragraphs); a value that is not a string is an error naming its row.
  The dataset is Arrow on disk, read a batch at a time.
  """
  from jaxtl.data import hf_datasets  # pylint: disable=g-import-not-at-top
  source = dict(source)
  if source.get("files"):  # A builder (csv, json, parquet) on local files.
    source["files"] = {split: _split_files(source, split)}
  else:  # A Hub name or a folder: renaming splits, as tfds does.
    source["splits"] = {split: _renamed_split(source, split)}
  for key in ("name", "cache_dir"):
    if source.get(key) and _DATA_DIR_PLACEHOLDER in source[key]:
      source[key] = expand_path(source[key])
  field = source.get("field") or "text"
  texts = (text_field(row, field, where)
           for where, row in hf_datasets.records(source, split))
  yield from (text for text in texts if text.strip())


def _iter_parquet(path: str, field: str) -> Iterator[str]:
  """One string column of a Parquet file, a record batch at a time."""
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


def _iter_files(source: Mapping[str, Any], split: str) -> Iterator[str]:
  kind = source["kind"]
  if kind == "tsv" and "column" not in source:
    raise ValueError("source of kind 'tsv' needs 'column'")
  for path in _split_files(source, split):
    if kind == "text":
      docs = iter_text(path, encoding=source.get("encoding", "utf-8"),
                       paragraphs=source.get("paragraphs", False))
      yield from _match_lines(docs, source.get("line_pattern", ""), path)
    elif kind == "jsonl":
      yield from iter_jsonl(path, field=source.get("field", "text"),
                            filter=source.get("filter"))
    elif kind == "parquet":
      yield from _iter_parquet(_check_file(path), source.get("field", "text"))
    else:  # tsv
      yield from iter_tsv_column(
          path, source["column"], header=source.get("header", True),
          encoding=source.get("encoding", "utf-8-sig"))


def _match_lines(docs: Iterable[str], pattern: str, path: str) -> Iterator[str]:
  """Each document's first ``pattern`` group (all of it without a pattern).

  A labeled file's texts read as a corpus, without their labels: TREC's
  lines are ``LABEL:fine question``, and ULMFiT's target-domain LM stage
  reads the task's own questions (``^\\S+ (.*)$``). A line that does not
  match is an error: silently dropping it would hide a wrong pattern.
  """
  if not pattern:
    yield from docs
    return
  regex = re.compile(pattern)
  if regex.groups < 1:
    raise ValueError(f"line_pattern={pattern!r} needs a group: the text to keep")
  for i, doc in enumerate(docs):
    m = regex.search(doc)
    if m is None:
      raise ValueError(f"{path}: document {i + 1} ({doc[:60]!r}) does not match "
                       f"line_pattern={pattern!r}")
    yield m.group(1)


def _iter_mixture(source: Mapping[str, Any], split: str, seed: int) -> Iterator[str]:
  """The split's documents from every part that has it (see
  jaxtl.data.mixtures): all of them in name order for ``mixing="concat"``,
  a seeded draw at the configured shares otherwise (a part whose rate is 0
  is not read). Parts stream; a weighted draw reads each part once more to
  count it first."""
  parts = source.get("parts")
  if not isinstance(parts, Mapping) or not parts:
    raise ValueError("source of kind 'mixture' needs 'parts', a mapping from "
                     "a name to a source description")
  mixing, cap, temperature = mixtures.settings(source)
  texts: dict[str, Callable[[], Iterator[str]]] = {}
  rates: dict[str, float] = {}
  found = False
  for name in sorted(parts):
    part = dict(parts[name])
    if part.get("kind") == "mixture":
      raise ValueError(f"mixture part {name!r}: parts cannot be mixtures")
    rate = mixtures.part_rate(name, part, mixing)
    part.pop("rate", None)
    if not _has_split(part, split):
      continue
    found = True
    if rate == 0:
      continue
    texts[name] = functools.partial(_part_texts, name, part, split)
    if rate is not None:
      rates[name] = rate
  if not found:
    raise ValueError(f"no part of the mixture has split {split!r}; parts: "
                     f"{sorted(parts)}")
  if mixing == "concat":
    for name in texts:
      yield from texts[name]()
    return
  if mixing == "rates" and not texts:
    raise ValueError(f"source.parts.*.rate: all rates of the parts with split "
                     f"{split!r} are 0; at least one must be > 0")
  sizes = {name: sum(1 for _ in stream()) for name, stream in texts.items()}
  share = mixtures.shares(sizes, mixing, rates=rates, cap=cap,
                          temperature=temperature)
  yield from mixtures.mix(texts, sizes, share, seed=seed, split=split)


def _part_texts(name: str, part: Mapping[str, Any], split: str) -> Iterator[str]:
  """A mixture part's texts; its errors name the part."""
  try:
    yield from iter_texts(part, split)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"mixture part {name!r}: {e}") from e


def _has_split(part: Mapping[str, Any], split: str) -> bool:
  """Whether a part lists `split` (tfds parts without a renaming: always)."""
  if part.get("kind") == "tfds" or (part.get("kind") == "hf" and not part.get("files")):
    return part.get("splits") is None or split in part["splits"]
  return split in (part.get("files") or {})


def _not_texts(source: Mapping[str, Any], split: str) -> Iterator[str]:
  raise ValueError(
      f"a 'pretokenized' source ({source.get('data_dir')}) holds token ids, "
      "not texts: jaxtl.data.row_store reads its shards; it cannot be a mixture "
      "part or train a tokenizer (mix the texts, then pretokenize the mixture)")


_READERS = {
    "text": _iter_files,
    "jsonl": _iter_files,
    "tsv": _iter_files,
    "parquet": _iter_files,
    "tfds": _iter_tfds,
    "hf": _iter_hf,
    "mixture": _iter_mixture,
    "pretokenized": _not_texts,  # jaxtl.data.pretokenized
}
KINDS: Sequence[str] = tuple(_READERS)


def load_texts(source: Mapping[str, Any], split: str, *, seed: int = 0
               ) -> list[str]:
  """A split's texts as a list (`iter_texts`), for splits that fit in memory."""
  return list(iter_texts(source, split, seed=seed))


def iter_texts(source: Mapping[str, Any], split: str, *, seed: int = 0
               ) -> Iterator[str]:
  """Reads a split of a dataset described by a config dict, lazily.

  `source["kind"]` is one of `KINDS`. File kinds take `files` (split name ->
  a path or list of paths, which may contain `{data_dir}`) plus the reader's
  options (`field`, `filter`, `column`, `header`, `encoding`, `paragraphs`,
  `line_pattern`: a regex whose first group is each text document's text);
  "tfds" takes `name`, optional `data_dir` (where prepared data lives;
  default tfds_reader.TFDS_DEFAULT_DIR_DOC), `manual_dir`, `field` and `splits` (a
  renaming of split names to TFDS split strings). "hf" takes `name` (a Hub
  dataset, a save_to_disk folder, or csv/tsv/json/parquet with `files`),
  optional `subset`, `cache_dir` (default jaxtl.data.hf_datasets.
  DEFAULT_CACHE_DOC), `field` (the text column) and `splits`. "mixture"
  takes `parts`, a mapping from names to such descriptions, and `mixing`:
  "concat" (default) concatenates the parts that list the split (a part
  without it is left out, so e.g. only one corpus may provide the
  validation text); "rates" (a `rate` in each part) and "proportional"
  (T5's, with `cap` and `temperature`) draw the split at those shares
  (jaxtl.data.mixtures). "parquet" takes `files` and `field` (a string
  column). "pretokenized" (`data_dir`: shards written by
  jaxtl pretokenize) has token ids, not texts: jaxtl.data.row_store
  reads it.

  Files are opened when the first text is asked for and read as the texts
  are consumed, so a corpus larger than memory
  streams. An unknown kind fails here; a missing file or bad row when the
  reading reaches it.

  Args:
    source: The dataset description (a dict or ml_collections ConfigDict).
    split: The split to read, e.g. "train".
    seed: Which documents a weighted mixture draws, and in what order (the
      run's seed); other sources ignore it.

  Returns:
    An iterator over the split's texts.
  """
  if hasattr(source, "to_dict"):  # ml_collections.ConfigDict.
    source = source.to_dict()
  kind = source.get("kind")
  if kind not in _READERS:
    raise ValueError(f"unknown source kind {kind!r}; known kinds: "
                     f"{', '.join(KINDS)}")
  if kind == "mixture":
    return _iter_mixture(source, split, seed)
  return _READERS[kind](source, split)
