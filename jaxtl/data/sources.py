"""A corpus, by kind: the typed ``config.data.source`` sections, and the
readers that turn a split of one into a stream of texts.

A corpus may be larger than host memory, so every reader is a generator
that reads its files as they are consumed (`iter_texts`); `load_texts` is
the list for the small splits that want one. Tokenization and packing
happen later (jaxtl.data.row_store). Local files are read by
:mod:`jaxtl.data.text_files`, TFDS datasets by :mod:`jaxtl.data.tfds_reader`
(which alone imports TensorFlow, and only when a source asks for it),
Hugging Face datasets by :mod:`jaxtl.data.hf_datasets`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from jaxtl import sections
from jaxtl.data import hf_datasets, mixtures, network, text_files, tfds_reader
from jaxtl.sections import key

# ----------------------------------------------------------------------------
# A corpus, by kind (config.data.source): one typed section per kind.


@dataclasses.dataclass(frozen=True)
class SourceConfig(sections.Kinded):
  """A corpus, read as a stream by :func:`iter_texts`."""
  KIND_KEY: ClassVar[str] = "kind"
  KINDS: ClassVar[dict[str, type]] = {}  # filled below, in this order
  kind: str = key("tfds", "corpus format")


# Every file source has the default splits' keys, so that a recipe of any
# kind reads local files from the command line alone:
# --config.data.source.kind=text --config.data.source.files.train=my.txt ...
# (a tuple: one path, or the flag repeated; a list could not be overridden).
NO_FILES = {"train": (), "validation": ()}
FILES_MEANING = "the files of split {name} ({data_dir}: $JAXTL_DATA_DIR)"


def given_files(files: Mapping[str, Any]) -> dict[str, Any]:
  """``files`` without the splits given no path."""
  return {split: paths for split, paths in files.items() if paths}


@dataclasses.dataclass(frozen=True)
class TfdsSource(SourceConfig):
  """A TensorFlow Datasets dataset."""
  name: str = key("", "the dataset")
  # tfds's default: $TFDS_DATA_DIR, else ~/tensorflow_datasets.
  data_dir: str = key("", "the prepared data (\"\": the default)")
  manual_dir: str = key("", "the source files to prepare the dataset from")
  field: str = key("text", "the column or feature holding the text")


@dataclasses.dataclass(frozen=True)
class HFSource(SourceConfig):
  """A Hugging Face dataset: on the Hub, saved to disk, or a builder on files."""
  name: str = key("", "a Hub dataset, a save_to_disk folder, or csv | tsv | json | "
                      "parquet for files")
  field: str = key("text", "the column or feature holding the text")
  subset: str = key("", "the Hub dataset's configuration (\"qnli\")")
  cache_dir: str = key("", "the datasets cache (\"\": $HF_DATASETS_CACHE or its default)")
  files: dict[str, Any] = key(NO_FILES, FILES_MEANING)

  def __post_init__(self):
    object.__setattr__(self, "files", given_files(self.files))


@dataclasses.dataclass(frozen=True)
class FileSource(SourceConfig):
  """Local files: plain text, JSON lines, TSV or Parquet."""
  field: str = key("text", "the column or feature holding the text",
                   kinds=("jsonl", "tsv", "parquet"))
  files: dict[str, Any] = key(NO_FILES, FILES_MEANING)
  paragraphs: bool = key(False, "each file is one document; False: each non-blank "
                                "line is one", kinds=("text",))
  encoding: str = key("utf-8", "the files' encoding", kinds=("text",))
  # TREC's labeled lines without their labels: "^\\S+ (.*)$".
  line_pattern: str = key("", "a regex; each document becomes its first group "
                              "(\"\": the whole line)", kinds=("text",))

  def __post_init__(self):
    object.__setattr__(self, "files", given_files(self.files))


@dataclasses.dataclass(frozen=True)
class MixturePart:
  """One part of a mixture: a source, and its share when mixing=rates."""
  # In a recipe the part is one dict: the source's keys beside ``rate``.
  source: SourceConfig = dataclasses.field(
      default_factory=lambda: TfdsSource(), metadata={"meaning": "the part's corpus",
                                                      "inline": True})
  rate: float = key(1.0, "mixing=rates: this part's share of the documents "
                         "(rates are normalised)")

  @classmethod
  def from_section(cls, values: Mapping[str, Any], where: str) -> MixturePart:
    """A part from its ConfigDict entry: the source's keys and ``rate``."""
    return cls(sections.build(SourceConfig, values, where), values.get("rate", 1.0))


@dataclasses.dataclass(frozen=True)
class MixtureSource(SourceConfig):
  """Several corpora mixed (jaxtl.data.mixtures)."""
  parts: dict[str, MixturePart] = key({}, "part {name} of the mixture")
  mixing: str = key("concat", "concat (all of every part) | rates (each part's rate) | "
                              "proportional (T5's; jaxtl.data.mixtures)")
  cap: int = key(0, "mixing=proportional: a part counts at most this many documents; "
                    "0: no cap")
  temperature: float = key(1.0, "mixing=proportional: share ∝ min(documents, cap) ** "
                                "(1 / temperature)")


@dataclasses.dataclass(frozen=True)
class PretokenizedSource(SourceConfig):
  """Token ids written once by ``jaxtl pretokenize`` (jaxtl.data.pretokenized)."""
  data_dir: str = key("", "jaxtl pretokenize's output")


SourceConfig.KINDS.update(tfds=TfdsSource, hf=HFSource, text=FileSource,
                          jsonl=FileSource, tsv=FileSource, parquet=FileSource,
                          mixture=MixtureSource, pretokenized=PretokenizedSource)


def mixture_settings(source: MixtureSource) -> tuple[str, int, float]:
  """A ``MixtureSource``'s ``(mixing, cap, temperature)``, checked.

  Raises:
    ValueError: naming the key (``source.mixing``, ``source.cap``,
      ``source.temperature``) for an unknown mode, a negative or fractional
      cap, a non-positive temperature, or a cap / temperature set for a
      mode that does not read it (silently ignoring it would hide a typo).
  """
  mixing = source.mixing or "concat"
  if mixing not in mixtures.MODES:
    raise ValueError(f"source.mixing={mixing!r}: expected one of "
                     f"{', '.join(mixtures.MODES)}")
  cap, temperature = source.cap or 0, source.temperature
  if not isinstance(cap, numbers.Integral) or isinstance(cap, bool) or cap < 0:
    raise ValueError(f"source.cap={cap!r}: expected a whole number of documents "
                     ">= 0 (0: no cap)")
  if not isinstance(temperature, (int, float)) or not temperature > 0:
    raise ValueError(f"source.temperature={temperature!r}: expected a number > 0")
  if mixing != "proportional" and (cap or temperature != 1.0):
    raise ValueError(f"source.cap / source.temperature are only read with "
                     f"source.mixing='proportional', not {mixing!r}")
  return mixing, int(cap), float(temperature)


def is_weighted(source: SourceConfig) -> bool:
  """Whether the source is a mixture whose documents depend on the seed."""
  return isinstance(source, MixtureSource) and (source.mixing or "concat") != "concat"


def part_rate(name: str, part: MixturePart, mixing: str) -> float | None:
  """A ``MixturePart``'s configured ``rate`` (None when the mode does not
  read one).

  Other modes ignore a rate rather than refuse it: a locked recipe declares
  ``rate`` in its parts (default 1) for
  ``--config.data.source.parts.X.rate`` to be settable, and still runs as
  ``concat`` by default.
  """
  if mixing != "rates":
    return None
  rate = part.rate
  if rate is None:
    raise ValueError(f"source.parts.{name}.rate is not set (None): "
                     "source.mixing='rates' needs a rate for every part")
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
      rate >= 0 and math.isfinite(rate)):
    raise ValueError(f"source.parts.{name}.rate={rate!r}: expected a finite "
                     "number >= 0")
  return float(rate)


def source_config(values: Mapping[str, Any]) -> SourceConfig:
  """The typed source of a mapping (a ConfigDict section, or a dict written
  in Python: keys it leaves out take their defaults)."""
  return sections.build(SourceConfig, values, "source")



DATA_DIR_ENV = network.DATA_DIR_ENV
SOURCE_FLAGS = "--config.data.source"  # a pretraining recipe's source, on the command line
_DATA_DIR_PLACEHOLDER = "{data_dir}"

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
        f"no data directory: set the environment variable {DATA_DIR_ENV} to the "
        f"folder holding the datasets (export {DATA_DIR_ENV}=~/data)")
  return data_dir


def expand_path(path: Any) -> str:
  """Substitutes the data directory into a configured path."""
  path = os.fspath(path)
  if _DATA_DIR_PLACEHOLDER in path:
    path = path.replace(_DATA_DIR_PLACEHOLDER, require_data_dir())
  return path


def _split_files(source: HFSource | FileSource, split: str) -> list[str]:
  """The paths of ``split`` in ``source.files``, ``{data_dir}`` expanded."""
  files = source.files
  if not isinstance(files, Mapping):
    raise ValueError(f"source of kind {source.kind!r} needs 'files', a "
                     "mapping from split name to paths")
  if split not in files:
    has = f"files for {', '.join(sorted(files))} only" if files else "no files"
    raise ValueError(f"a source of kind {source.kind!r} has {has}, none for split "
                     f"{split!r}: name them with {SOURCE_FLAGS}.files.{split}=PATH "
                     "(repeat it for more files)")
  paths = files[split]
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  under = [os.fspath(p) for p in paths if _DATA_DIR_PLACEHOLDER in os.fspath(p)]
  if under and resolve_data_dir() is None:  # the recipe's files, not the user's
    raise ValueError(
        f"{SOURCE_FLAGS}.files.{split} names {under[0]!r}, in the data directory, "
        f"and none is set: export {DATA_DIR_ENV}=FOLDER (the folder holding the "
        f"datasets), or name your own files with {SOURCE_FLAGS}.files.{split}=PATH")
  return [expand_path(p) for p in paths]


def _reads_files(source: SourceConfig) -> bool:
  """Whether ``source.files`` is read: a file kind's, or an hf builder's
  (csv, json, parquet); a Hub dataset or folder has splits of its own."""
  return isinstance(source, FileSource) or (
      isinstance(source, HFSource) and source.name in hf_datasets.BUILDERS)


def check_files(source: SourceConfig, splits: Iterable[str]) -> None:
  """Raises unless a source of local files names files for each of
  ``splits`` and they exist: checked before a run's work, which would
  otherwise find a missing validation file after training a tokenizer."""
  if not _reads_files(source):
    return
  for split in splits:
    for path in _split_files(source, split):
      if not os.path.exists(path):
        raise FileNotFoundError(f"{path} (a file of split {split!r}): no such file")


def _iter_tfds(source: TfdsSource, split: str, flags: str = SOURCE_FLAGS) -> Iterator[str]:
  yield from tfds_reader.iter_tfds(
      source.name, split,
      # "": TFDS's default data_dir; no manual_dir: download.
      data_dir=expand_path(source.data_dir) if source.data_dir else None,
      manual_dir=expand_path(source.manual_dir) if source.manual_dir else None,
      field=source.field or "text", flags=flags)


def _iter_hf(source: HFSource, split: str, flags: str = SOURCE_FLAGS) -> Iterator[str]:
  """A Hugging Face dataset's text column (jaxtl.data.hf_datasets), ``field``.

  Blank texts are left out (WikiText on the Hub has an empty row between
  paragraphs); a value that is not a string is an error naming its row.
  The dataset is Arrow on disk, read a batch at a time. ``flags`` is the
  source's command-line prefix, for messages.
  """
  spec = hf_datasets.HFSpec(
      name=expand_path(source.name), subset=source.subset,
      # A builder (csv, json, parquet) on local files; else a Hub name or a
      # folder, whose split is read under its own name (a recipe's files,
      # left from its own kind, are not read).
      files={split: _split_files(source, split)} if _reads_files(source) else {},
      cache_dir=expand_path(source.cache_dir), flags=flags)
  field = source.field or "text"
  texts = (text_files.text_field(row, field, where)
           for where, row in hf_datasets.records(spec, split))
  yield from (text for text in texts if text.strip())


def _iter_files(source: FileSource, split: str) -> Iterator[str]:
  """Each file of the split in turn, read as its kind says: ``text`` (lines
  or whole files, ``line_pattern``), ``jsonl``, ``tsv`` (the column named
  ``field`` of a file with a header line) or ``parquet`` (the column
  ``field``)."""
  field = source.field or "text"
  for path in _split_files(source, split):
    if source.kind == "text":
      docs = text_files.iter_text(path, encoding=source.encoding, paragraphs=source.paragraphs)
      yield from _match_lines(docs, source.line_pattern, path)
    elif source.kind == "jsonl":
      yield from text_files.iter_jsonl(path, field=field)
    elif source.kind == "parquet":
      yield from text_files.iter_parquet_column(text_files.check_file(path), field)
    else:  # tsv: UTF-8, a BOM (MRPC's) dropped.
      yield from text_files.iter_tsv_column(path, field)


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


def _iter_mixture(source: MixtureSource, split: str, seed: int) -> Iterator[str]:
  """The split's documents from every part that has it (see
  jaxtl.data.mixtures): all of them in name order for ``mixing="concat"``,
  a seeded draw at the configured shares otherwise (a part whose rate is 0
  is not read). Parts stream; a weighted draw reads each part once more to
  count it first."""
  parts = source.parts
  if not isinstance(parts, Mapping) or not parts:
    raise ValueError("source of kind 'mixture' needs 'parts', a mapping from "
                     "a name to a source description")
  mixing, cap, temperature = mixture_settings(source)
  texts: dict[str, Callable[[], Iterator[str]]] = {}
  rates: dict[str, float] = {}
  found = False
  for name in sorted(parts):
    part = parts[name]
    if isinstance(part.source, MixtureSource):
      raise ValueError(f"mixture part {name!r}: parts cannot be mixtures")
    if isinstance(part.source, PretokenizedSource):
      raise ValueError(f"mixture part {name!r}: {_pretokenized_error(part.source)}")
    rate = part_rate(name, part, mixing)
    if not _has_split(part.source, split):
      continue
    found = True
    if rate == 0:
      continue
    texts[name] = functools.partial(_part_texts, name, part.source, split)
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
  sizes, characters = {}, {}
  for name, stream in texts.items():  # one streaming pass per part counts both
    sizes[name] = characters[name] = 0
    for text in stream():
      sizes[name] += 1
      characters[name] += len(text)
  share = mixtures.shares(sizes, mixing, rates=rates, cap=cap,
                          temperature=temperature)
  mixtures.check_growth(sizes, characters, share, split)
  yield from mixtures.mix(texts, sizes, share, seed=seed, split=split)


def _part_texts(name: str, part: SourceConfig, split: str) -> Iterator[str]:
  """A mixture part's texts; its errors name the part."""
  try:
    if isinstance(part, (HFSource, TfdsSource)):  # messages name the part's own flags
      yield from _READERS[type(part)](part, split, f"{SOURCE_FLAGS}.parts.{name}")
    else:
      yield from iter_texts(part, split)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"mixture part {name!r}: {e}") from e


def _has_split(part: SourceConfig, split: str) -> bool:
  """Whether a part has ``split``: a file part (or an hf builder on files)
  lists it in ``files``; a tfds or Hub dataset is asked for it by name."""
  if _reads_files(part):
    return split in (part.files or {})
  return True


def _pretokenized_error(source: PretokenizedSource) -> str:
  return (f"a 'pretokenized' source ({source.data_dir}) holds token ids, not "
          "texts: jaxtl.data.row_store reads its shards; it cannot be a mixture "
          "part or train a tokenizer (mix the texts, then pretokenize the mixture)")


def _not_texts(source: PretokenizedSource, split: str) -> Iterator[str]:
  raise ValueError(_pretokenized_error(source))


# The reader of each kind's section class (SourceConfig.KINDS names the kinds).
_READERS: Mapping[type, Callable[..., Iterator[str]]] = {
    TfdsSource: _iter_tfds,
    HFSource: _iter_hf,
    FileSource: _iter_files,  # text, jsonl, tsv, parquet
    MixtureSource: _iter_mixture,
    PretokenizedSource: _not_texts,  # jaxtl.data.pretokenized
}
KINDS: Sequence[str] = tuple(SourceConfig.KINDS)


def load_texts(source: SourceConfig, split: str, *, seed: int = 0) -> list[str]:
  """A split's texts as a list (`iter_texts`), for splits that fit in memory."""
  return list(iter_texts(source, split, seed=seed))


def iter_texts(source: SourceConfig, split: str, *, seed: int = 0
               ) -> Iterator[str]:
  """Reads a split of a corpus, lazily.

  ``source`` is the typed section of its kind (one of `KINDS`; build one
  from a ConfigDict section or a dict with :func:`source_config`). File
  kinds (:class:`FileSource`: text, jsonl, tsv, parquet) take ``files``
  (split name -> a path or list of paths, which may contain ``{data_dir}``)
  and ``field`` (jsonl's field; tsv's column, named by the file's header
  line; parquet's string column); text also ``encoding``, ``paragraphs``
  and ``line_pattern`` (a regex whose first group is each document's
  text). :class:`TfdsSource` takes ``name``, ``data_dir`` (where prepared
  data lives; default tfds_reader.TFDS_DEFAULT_DIR_DOC), ``manual_dir`` and
  ``field``; the split is read under its own name. :class:`HFSource` takes
  ``name`` (a Hub dataset, a save_to_disk folder, or csv/tsv/json/parquet
  with ``files``), ``subset``, ``cache_dir`` (default
  jaxtl.data.hf_datasets.DEFAULT_CACHE_DOC) and ``field`` (the text
  column). :class:`MixtureSource` takes ``parts`` (name ->
  :class:`MixturePart`: a source and its ``rate``) and ``mixing``:
  "concat" (default) concatenates the parts that list the split (a part
  without it is left out, so e.g. only one corpus may provide the
  validation text); "rates" (each part's ``rate``) and "proportional"
  (T5's, with ``cap`` and ``temperature``) draw the split at those shares
  (jaxtl.data.mixtures). :class:`PretokenizedSource` (``data_dir``: shards
  written by jaxtl pretokenize) has token ids, not texts:
  jaxtl.data.row_store reads it.

  Files are opened when the first text is asked for and read as the texts
  are consumed, so a corpus larger than memory streams. A source that is
  not a typed section of its kind fails here; a missing file or bad row
  when the reading reaches it.

  Args:
    source: The corpus's typed section.
    split: The split to read, e.g. "train".
    seed: Which documents a weighted mixture draws, and in what order (the
      run's seed); other sources ignore it.

  Returns:
    An iterator over the split's texts.
  """
  if not isinstance(source, SourceConfig):
    raise TypeError(f"iter_texts takes a typed source (a SourceConfig), not "
                    f"{type(source).__name__}: build it with "
                    "jaxtl.data.sources.source_config(mapping)")
  cls = SourceConfig.kind_class(source.kind, "source")
  if type(source) is not cls:  # pylint: disable=unidiomatic-typecheck
    raise ValueError(f"source.kind={source.kind!r} is read by {cls.__name__}, "
                     f"not {type(source).__name__}")
  if isinstance(source, MixtureSource):
    return _iter_mixture(source, split, seed)
  return _READERS[cls](source, split)
