"""Hugging Face `datasets` as a jaxtl source: labeled rows and pretraining text.

A spec says where a dataset lives, in one of three ways:

- a Hub dataset by name and subset (``glue``/``qnli``, ``super_glue``/``boolq``,
  ``ag_news``), read through the `datasets` cache (``cache_dir``; default
  ``$HF_DATASETS_CACHE``, else ``~/.cache/huggingface/datasets``);
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  (the offline way to bring a Hub dataset to a machine without network), or
  any other local folder of data files `datasets` can read;
- local files through `datasets`' own builders: ``name`` one of
  ``csv | tsv | json | parquet`` and ``files`` mapping a split to paths.

`records` yields ``(location, row)`` pairs, with ClassLabel values turned into
their names, so a labeled-file task reads a Hugging Face dataset as it reads
its other formats; `label_names` gives a ClassLabel's names in id order.
`jaxtl.data.sources` reads a text column of them as the pretraining corpus
kind ``"hf"``.

Without network, a Hub name is read from the cache or fails within seconds
(one TCP probe, then `datasets` in offline mode) with a message naming the
dataset, the cache it looked in and how to point it at local files, rather
than after `datasets`' retries. `datasets` is imported inside the functions
only: it stays out of the training import path.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jaxtl.data import network

# name -> (datasets builder, its options): local files read by datasets itself.
BUILDERS: Mapping[str, tuple[str, dict[str, Any]]] = {
    "csv": ("csv", {}),
    # GLUE-style TSVs: quotes are not special (sentences contain stray ").
    "tsv": ("csv", {"sep": "\t", "quoting": csv.QUOTE_NONE}),
    "json": ("json", {}),  # JSON lines or a JSON array.
    "parquet": ("parquet", {}),
}
DEFAULT_CACHE_DOC = "$HF_DATASETS_CACHE, else ~/.cache/huggingface/datasets"
_BATCH = 1024  # rows per Arrow read while iterating


@dataclasses.dataclass(frozen=True)
class HFSpec:
  """Where a dataset lives and how its columns map to jaxtl's fields.

  Attributes:
    name: A Hub dataset ("glue", "nyu-mll/glue", "ag_news"), a local folder
      (``save_to_disk`` output or data files), or a builder name in
      `BUILDERS` used with ``files``.
    subset: The Hub dataset's configuration ("qnli"); "" for none.
    files: For a builder name: split -> local file paths.
    columns: jaxtl field -> dataset column (e.g. {"text": "question",
      "text_pair": "sentence"}); rows come back with these fields renamed,
      other columns as they are.
    splits: jaxtl split -> the dataset's split ("validation" ->
      "validation_matched", or a Hub slice "train[:5%]").
    cache_dir: Where `datasets` caches Hub downloads and prepared Arrow
      files; "" for its default (`DEFAULT_CACHE_DOC`).
    flags: The command-line prefix its settings are set with
      ("--config.task.hf"), so a message names the flags to set; "": a
      spec written in Python, named by its fields.
  """
  name: str
  subset: str = ""
  files: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
  columns: Mapping[str, str] = dataclasses.field(default_factory=dict)
  splits: Mapping[str, str] = dataclasses.field(default_factory=dict)
  cache_dir: str = ""
  flags: str = ""

  @classmethod
  def from_mapping(cls, spec: Mapping[str, Any]) -> HFSpec:
    """A spec from a config dict; keys other than the fields are ignored, so
    a pretraining source (with its ``kind`` and ``field``) converts as it is."""
    if hasattr(spec, "to_dict"):  # ml_collections.ConfigDict.
      spec = spec.to_dict()
    files = {k: [os.fspath(v)] if isinstance(v, (str, os.PathLike)) else
             [os.fspath(p) for p in v] for k, v in (spec.get("files") or {}).items()}
    return cls(name=os.fspath(spec.get("name") or ""),
               subset=spec.get("subset") or "", files=files,
               columns=dict(spec.get("columns") or {}),
               splits=dict(spec.get("splits") or {}),
               cache_dir=os.fspath(spec.get("cache_dir") or ""),
               flags=spec.get("flags") or "")

  @property
  def label(self) -> str:
    """How messages and locations name the dataset: "glue/qnli", a path."""
    return f"{self.name}/{self.subset}" if self.subset else self.name


SpecLike = HFSpec | Mapping[str, Any]


def as_spec(spec: SpecLike) -> HFSpec:
  """An `HFSpec` as it is, or one made from a config mapping."""
  return spec if isinstance(spec, HFSpec) else HFSpec.from_mapping(spec)


def _datasets():
  try:  # optional (pip install 'jaxtl[hf]'), heavy: it imports pandas and pyarrow
    import datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("reading Hugging Face datasets needs the `datasets` "
                      f"package: pip install datasets ({e})") from e
  return datasets


def cache_dir(spec: SpecLike) -> str:
  """The spec's cache dir, else `datasets`' default (`DEFAULT_CACHE_DOC`)."""
  spec = as_spec(spec)
  return spec.cache_dir or _datasets().config.HF_DATASETS_CACHE


def _local(name: str) -> bool:
  """Whether ``name`` is a path rather than a Hub name or builder."""
  return os.path.exists(name) or name.startswith(("/", ".", "~"))


def load_parts(spec: SpecLike, split: str) -> list[tuple[str, Any]]:
  """(location prefix, `datasets.Dataset`) pairs making up ``split``.

  A builder spec loads each file on its own, so a row's location names its
  file; the other kinds give one part.
  """
  spec = as_spec(spec)
  if not spec.name:
    raise ValueError("Hugging Face dataset spec needs 'name': a Hub dataset, a "
                     f"save_to_disk folder, or one of {', '.join(BUILDERS)}")
  if spec.name in BUILDERS:
    return [(path, _from_file(spec, path)) for path in _split_files(spec, split)]
  hf_split = spec.splits.get(split, split)
  if _local(spec.name):
    return [(f"{spec.name} {hf_split}", _from_folder(spec, hf_split))]
  return [(f"{spec.label} {hf_split}", _from_hub(spec, hf_split))]


def _split_files(spec: HFSpec, split: str) -> list[str]:
  if not spec.files:
    raise ValueError(f"Hugging Face builder {spec.name!r} needs 'files', a "
                     "mapping from split name to local paths")
  if split not in spec.files:
    raise ValueError(f"unknown split {split!r}; the {spec.name} files have "
                     f"{sorted(spec.files)}")
  paths = [os.path.expanduser(p) for p in spec.files[split]]
  for path in paths:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"data file not found: {path}")
  return paths


def _from_file(spec: HFSpec, path: str) -> Any:
  builder, options = BUILDERS[spec.name]
  return _datasets().load_dataset(builder, data_files={"train": [path]},
                                  split="train", cache_dir=cache_dir(spec),
                                  **options)


def _from_folder(spec: HFSpec, split: str) -> Any:
  """A save_to_disk folder (a DatasetDict's split, or a lone Dataset), else
  the folder's data files through `datasets.load_dataset`."""
  datasets = _datasets()
  folder = os.path.expanduser(spec.name)
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"Hugging Face dataset folder not found: {folder}")
  if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
    saved = datasets.load_from_disk(folder)
    if split not in saved:
      raise ValueError(f"{folder} has splits {sorted(saved)}; no {split!r}")
    return saved[split]
  if os.path.isfile(os.path.join(folder, "state.json")):
    saved = datasets.load_from_disk(folder)
    # A lone Dataset answers for the split it was saved as (train if unnamed).
    if split != (saved.split or "train"):
      raise ValueError(f"{folder} holds one Dataset (split "
                       f"{saved.split or 'unnamed: read as train'}), not "
                       f"{split!r}; save a DatasetDict to have several splits")
    return saved
  return datasets.load_dataset(folder, spec.subset or None, split=split,
                               cache_dir=cache_dir(spec))


@contextlib.contextmanager
def _offline(datasets: Any, on: bool) -> Iterator[None]:
  """`datasets` and huggingface_hub in offline mode for a block: they read
  the flag when they make a request, so a cached copy still loads and a
  missing one fails at once instead of retrying."""
  if not on:
    yield
    return
  # optional: installed with `datasets` (jaxtl[hf]), which the caller has loaded
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
  datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
  try:
    yield
  finally:
    datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _from_hub(spec: HFSpec, split: str) -> Any:
  datasets = _datasets()
  # optional: installed with `datasets` (jaxtl[hf]), loaded just above
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  offline = bool(datasets.config.HF_HUB_OFFLINE)
  why = ("offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)" if offline
         else network.unreachable(constants.ENDPOINT))
  cache = cache_dir(spec)
  try:
    with _offline(datasets, why is not None):
      return datasets.load_dataset(spec.name, spec.subset or None, split=split,
                                   cache_dir=cache)
  except (ConnectionError, FileNotFoundError) as e:
    if why is None and not isinstance(e, ConnectionError):
      raise  # Online: e.g. no such dataset, in datasets' own words.
    raise network.DataUnavailable(offline_message(spec, split, cache, why or str(e))) from e


def offline_message(spec: HFSpec, split: str, cache: str, why: str) -> str:
  """What to do when a Hub dataset is neither cached nor downloadable, in
  the flags of ``spec.flags`` (else in the spec's field names)."""
  subset = f", {spec.subset!r}" if spec.subset else ""
  save = (f"on a machine with network, datasets.load_dataset({spec.name!r}{subset})"
          ".save_to_disk('FOLDER'), then copy FOLDER here")
  head = (f"Hugging Face dataset {spec.label!r} (split {split!r}) is not in the "
          f"cache {cache} and cannot be downloaded: {why}.")
  if spec.flags:
    return (f"{head} Save it as a folder ({save}) and pass {spec.flags}.name=FOLDER, "
            f"or pass {spec.flags}.cache_dir=CACHE, a cache that holds it (default "
            f"{DEFAULT_CACHE_DOC}).")
  return (f"{head} Point the spec at local files instead: name=a folder written "
          f"by save_to_disk ({save}), or name='csv'|'tsv'|'json'|'parquet' with "
          "files={'train': [...], ...}; or set cache_dir (default "
          f"{DEFAULT_CACHE_DOC}) to a cache that holds it.")


def _class_labels(features: Mapping[str, Any]) -> dict[str, tuple[Any, bool]]:
  """column -> (its ClassLabel, whether the column is a list of them)."""
  datasets = _datasets()
  out = {}
  for column, feature in features.items():
    if isinstance(feature, datasets.ClassLabel):
      out[column] = (feature, False)
    elif isinstance(getattr(feature, "feature", None), datasets.ClassLabel):
      out[column] = (feature.feature, True)  # List/Sequence (token tags).
  return out


def _name(label: Any, value: Any) -> str | None:
  """A class id's name; negative ids (GLUE's unlabeled test rows) -> None."""
  return None if value is None or value < 0 else label.int2str(value)


def _check_columns(spec: HFSpec, where: str, columns: Sequence[str]) -> None:
  missing = [c for c in spec.columns.values() if c not in columns]
  if missing:
    raise ValueError(f"{where}: no column {', '.join(map(repr, missing))} for "
                     f"the column mapping {dict(spec.columns)}; it has "
                     f"{list(columns)}")


def records(spec: SpecLike, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(location, row) for every row of ``split``, in the dataset's order.

  The location reads "glue/qnli train row 17", "FOLDER train row 17" or
  "FILE row 17", the row index 0-based as in ``dataset[17]``. ClassLabel
  values (and lists of them) come back as their names, None for a negative
  id; ``spec.columns`` renames columns to jaxtl's fields.

  Args:
    spec: An `HFSpec` or a config mapping with its fields.
    split: jaxtl's split name (renamed by ``spec.splits``; a builder spec's
      key in ``files``).

  Yields:
    The location and the row dict.
  """
  spec = as_spec(spec)
  rename = {column: field for field, column in spec.columns.items()}
  for where, ds in load_parts(spec, split):
    _check_columns(spec, where, ds.column_names)
    labels = _class_labels(ds.features)
    index = 0
    for batch in ds.iter(batch_size=_BATCH):
      for column, (label, is_list) in labels.items():
        batch[column] = [[_name(label, v) for v in vs] if is_list and vs is not None
                         else _name(label, vs) for vs in batch[column]]
      n = len(next(iter(batch.values()))) if batch else 0
      for j in range(n):
        yield (f"{where} row {index}",
               {rename.get(k, k): v[j] for k, v in batch.items()})
        index += 1


def label_names(spec: SpecLike, split: str = "train",
                field: str = "label") -> tuple[str, ...] | None:
  """The class names of ``field``'s ClassLabel (or list of them), in id
  order; None when the column holds plain values (e.g. strings).

  A ClassLabel fixes the ids the dataset's authors chose, so a task reading
  it keeps their order instead of sorting the names it sees.
  """
  spec = as_spec(spec)
  column = spec.columns.get(field, field)
  where, ds = load_parts(spec, split)[0]
  if column not in ds.features:
    raise ValueError(f"{where}: no column {column!r}; it has {ds.column_names}")
  found = _class_labels(ds.features).get(column)
  return tuple(found[0].names) if found else None
