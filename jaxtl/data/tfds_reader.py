"""TensorFlow Datasets splits as lists of texts, failing fast offline.

Split out of :mod:`jaxtl.data.sources` (its ``tfds`` kind): TensorFlow is
imported here only, inside :func:`iter_tfds`, and kept off the accelerators.
An unprepared dataset on a machine without network fails within seconds,
naming the dataset, where it looked and how to point it at local files, and
a failed preparation leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

from jaxtl.data import network

PathLike = str | os.PathLike[str]

TFDS_DEFAULT_DIR_DOC = "$TFDS_DATA_DIR, else ~/tensorflow_datasets"
# Where TFDS first looks for a dataset's files (its GCS mirror): reaching it
# says whether downloading can work before TFDS retries for minutes.
TFDS_PROBE_URL = "https://storage.googleapis.com"


def read_tfds(name: str, split: str, *, data_dir: PathLike | None = None,
              manual_dir: PathLike | None = None,
              field: str = "text") -> list[str]:
  """A text field of a TensorFlow Datasets split, as a list (`iter_tfds`)."""
  return list(iter_tfds(name, split, data_dir=data_dir, manual_dir=manual_dir,
                        field=field))


def iter_tfds(name: str, split: str, *, data_dir: PathLike | None = None,
              manual_dir: PathLike | None = None,
              field: str = "text", flags: str = "") -> Iterator[str]:
  """Reads a text field of a TensorFlow Datasets split (prepared if needed),
  example by example as they are consumed.

  TensorFlow is imported here only, and hidden from the accelerators so it
  never grabs GPU memory that JAX needs. A split already prepared under
  ``data_dir`` is read as it is; otherwise TFDS prepares it, from
  ``manual_dir`` or by downloading. Without network that fails within
  seconds, naming the dataset, where it looked and how to point it at local
  files, and a failed preparation leaves nothing behind in ``data_dir``.

  Args:
    name: The TFDS dataset name, e.g. "tiny_shakespeare".
    split: A TFDS split string, e.g. "train" or "train[:90%]".
    data_dir: Where TFDS keeps prepared data (None: TFDS's default,
      TFDS_DEFAULT_DIR_DOC).
    manual_dir: Folder with manually downloaded source files, for offline
      preparation.
    field: The feature holding the text.
    flags: The command-line prefix of the source's settings
      ("--config.data.source"), which a message names; "": their names.

  Yields:
    The texts, one per example.
  """
  tfds = _import_tfds()
  data_dir = os.fspath(data_dir) if data_dir is not None else tfds.core.constants.DATA_DIR
  with _quiet_absent_variant(os.path.join(data_dir, name)):
    try:
      builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
      # TFDS's own message lists every dataset it knows: hundreds of lines.
      raise ValueError(f"TFDS has no dataset {name!r} (tensorflow-datasets "
                       f"{tfds.__version__}); see tensorflow.org/datasets/"
                       "catalog, or read local files with source kind text, "
                       "jsonl, tsv or hf") from e
    prepared = builder.is_prepared()
  if not prepared:
    _prepare_tfds(tfds, builder, name, data_dir, manual_dir, flags)
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    if field not in example:
      raise ValueError(f"TFDS {name}[{split}] has no feature {field!r}; it "
                       f"has {sorted(example)}")
    value = example[field]
    if isinstance(value, bytes):
      value = value.decode("utf-8")
    elif not isinstance(value, str):
      raise ValueError(f"TFDS {name}[{split}] feature {field!r} is not text "
                       f"({type(value).__name__})")
    yield value


def _import_tfds():
  """tensorflow_datasets, with TensorFlow kept off the accelerators."""
  try:  # optional (pip install 'jaxtl[tfds]'), heavy: TensorFlow takes seconds
    # pylint: disable=g-import-not-at-top
    import tensorflow as tf
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError(
        "reading TFDS datasets needs TensorFlow Datasets: "
        f"pip install 'jaxtl[tfds]' ({e})") from e
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # TF already initialised its devices.
    pass
  return tfds


@contextlib.contextmanager
def _quiet_absent_variant(folder: str) -> Iterator[None]:
  """Drops TFDS's "Variant folder ... has no dataset_info.json" warning while
  ``folder`` does not exist: it names a folder that is not there and would
  read as a broken dataset on a first, clean run."""
  if os.path.exists(folder):
    yield
    return
  drop = lambda record: "has no dataset_info.json" not in record.getMessage()
  logger = logging.getLogger("absl")
  logger.addFilter(drop)
  try:
    yield
  finally:
    logger.removeFilter(drop)


def _prepare_tfds(tfds: Any, builder: Any, name: str, data_dir: str,
                  manual_dir: PathLike | None, flags: str = "") -> None:
  """Prepares ``builder`` from ``manual_dir`` or a download; on failure
  removes what it created under ``data_dir`` and says what to do."""
  kwargs: dict[str, Any] = {}
  if manual_dir is not None:
    manual_dir = os.fspath(manual_dir)
    if not os.path.isdir(manual_dir):
      raise FileNotFoundError(f"TFDS manual_dir not found: {manual_dir}")
    kwargs["download_config"] = tfds.download.DownloadConfig(manual_dir=manual_dir)
  else:
    why = network.unreachable(TFDS_PROBE_URL)
    if why is not None:
      raise network.DataUnavailable(_tfds_missing(name, data_dir, why, flags))
  created = [p for p in (data_dir, os.path.join(data_dir, name),
                         os.path.join(data_dir, "downloads"),
                         os.path.join(data_dir, "downloads", name))
             if not os.path.exists(p)]
  try:
    builder.download_and_prepare(**kwargs)
  except BaseException as e:
    for path in created:  # Outermost first: it holds the others.
      shutil.rmtree(path, ignore_errors=True)
    if manual_dir is not None or isinstance(e, KeyboardInterrupt):
      raise
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise network.DataUnavailable(_tfds_missing(name, data_dir, first[:300], flags)) from e


def _tfds_missing(name: str, data_dir: str, why: str, flags: str = "") -> str:
  """What to do when a TFDS dataset is neither prepared nor downloadable, in
  the flags of ``flags`` (else in the source's key names)."""
  env, hint = network.DATA_DIR_ENV, ""
  if not os.environ.get(env):
    hint = (f" jaxtl's recipes set manual_dir to ${env}/{name} when "
            f"{env} is set (it is not): export {env}=FOLDER "
            "holding the shared datasets and run again.")
  key = f"{flags}." if flags else ""
  return (
      f"TFDS dataset {name!r} is not prepared in {data_dir} (the source's "
      f"data_dir; default {TFDS_DEFAULT_DIR_DOC}) and cannot be downloaded: "
      f"{why}. Point it at local files: {key}data_dir=FOLDER where it is "
      f"prepared, or {key}manual_dir=FOLDER with its source files (datasets "
      "whose TFDS checksums name their files, e.g. tiny_shakespeare's "
      f"input.txt), or read the files directly: {key}kind=text (or "
      f"jsonl, tsv, hf) with {key}files.train=PATH.{hint}")
