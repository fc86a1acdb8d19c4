"""Batches of examples made from rows: deterministic, resumable, and the
same whoever makes them.

The serving half of the host input pipeline (:mod:`jaxtl.pretraining.pipeline`
makes the rows). It knows nothing of sources, tokenizers or objectives: it
takes rows (a :class:`~jaxtl.data.row_store.RowStore` or arrays) and a
``make_example`` function, and is also what fine-tuning feeds its task
features through. Batch ``k`` is a pure function of ``(seed, k)``, so Grain
may make batches in any order, in any worker process, and a run resumes
exactly from its ``(epoch, index)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import sys
import threading
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from absl import flags

from jaxtl.data import row_store

Example = dict[str, np.ndarray]
Row = dict[str, np.ndarray]  # "tokens", "segment_ids", "positions": [L]
Rows = dict[str, np.ndarray]  # the same, [N, L]

# Rows are grouped by length within chunks of this many batches (as
# `transformers`' group_by_length): enough rows for batches of near-equal
# lengths, few enough that a chunk is still a random sample of the split.
GROUP_BATCHES = 50


def grouped_order(rng: np.random.Generator, lengths: np.ndarray,
                  batch_size: int) -> np.ndarray:
  """A random order of rows in which each run of ``batch_size`` has rows of
  similar ``lengths``.

  The rows are shuffled, cut into chunks of :data:`GROUP_BATCHES` batches,
  sorted by length within each chunk, and the batches this makes are put
  in a random order (unlike `transformers`, whose batches go from longest
  to shortest within a chunk: a trend in length through the epoch). A batch
  cut to its longest row then carries little padding. The rows that do not
  fill a last batch come at the end.
  """
  n = len(lengths)
  order = rng.permutation(n)
  size = GROUP_BATCHES * batch_size
  order = np.concatenate([chunk[np.argsort(-lengths[chunk], kind="stable")]
                          for chunk in np.split(order, range(size, n, size))])
  full = n - n % batch_size
  batches = order[:full].reshape(-1, batch_size)
  return np.concatenate([batches[rng.permutation(len(batches))].ravel(), order[full:]])


@dataclasses.dataclass(frozen=True)
class _Batch:
  """Local batch ``k`` of a :class:`BatchIterator`: a pure function of
  ``k``, so Grain can make batches in any order, in any process."""
  rows: Any  # row_store.RowStore | row_store.ArrayRows
  make_example: Callable[..., Example]  # (row, rng[, partner]) -> example
  batch_size: int
  local: int
  offset: int
  batches_per_epoch: int
  seed: int
  shuffle: bool
  stream: tuple[int, ...]
  partners: bool = False
  make_batch: Callable[..., Example] | None = None  # (rows [B, L], rngs) -> batch
  # An epoch's shuffled order from its generator; None: a plain permutation.
  # Hashed by identity, as the order cache needs (hashing an array's values
  # per call would cost more than the cache saves).
  arrange: Callable[[np.random.Generator], np.ndarray] | None = None

  def rng(self, *key: int) -> np.random.Generator:
    """``default_rng((seed, *key))``, or its spawn for the stream (built
    directly: the same generator for a third less time, per example)."""
    return np.random.Generator(np.random.PCG64(
        np.random.SeedSequence((self.seed, *key), spawn_key=self.stream)))

  @functools.lru_cache(maxsize=2)
  def order(self, epoch: int) -> np.ndarray:
    n = len(self.rows)
    if not self.shuffle:
      return np.arange(n)
    if self.arrange is not None:
      return self.arrange(self.rng(epoch))
    return self.rng(epoch).permutation(n)

  def __call__(self, k: int) -> Example:
    epoch, index = divmod(k, self.batches_per_epoch)
    start = index * self.batch_size + self.offset
    ids = self.order(epoch)[start:start + self.local]
    rngs = [self.rng(epoch, int(i)) for i in ids]
    if self.make_batch is not None and not self.partners:
      return self.make_batch(self.rows.take_stacked(ids), rngs)
    rows = self.rows.take(ids)
    if self.partners:
      rows, partners = self._with_partners(ids, rows, rngs)
      if self.make_batch is not None:
        return self.make_batch(row_store.stack(rows), rngs, row_store.stack(partners))
      examples = [self.make_example(row, rng, partner)
                  for row, rng, partner in zip(rows, rngs, partners)]
    else:
      examples = [self.make_example(row, rng) for row, rng in zip(rows, rngs)]
    return row_store.stack(examples)

  def _with_partners(self, ids: np.ndarray, rows: list[Row],
                     rngs: list[np.random.Generator]) -> tuple[list[Row], list[Row]]:
    """The rows and a random partner row for each (drawn by the example's
    own generator: still a pure function of the batch number), all numbered
    by document (``row["document"]``) so that the objective can tell a
    partner's documents from its row's."""
    others = [int(rng.integers(len(self.rows))) for rng in rngs]
    firsts = self.rows.first_documents()
    number = lambda i, row: {**row, "document": np.int64(firsts[i])}
    return ([number(i, row) for i, row in zip(ids, rows)],
            [number(j, row) for j, row in zip(others, self.rows.take(others))])


class BatchIterator:
  """Deterministic, resumable batches of examples made from rows.

  Epoch ``e`` visits rows in ``permutation(seed, e)`` (or in order without
  shuffling), ``batch_size`` (global) rows per batch; this process keeps its
  contiguous ``1 / process_count`` share. Example ``i`` of epoch ``e`` is made
  with ``default_rng((seed, e, i))``. A non-empty ``stream`` (a later stage
  of a run) spawns independent generators from the same keys, so a stage
  that reads the same rows as an earlier one does not repeat its order and
  masks; the empty stream draws what the iterator always drew.

  Batches are made by a Grain pipeline over batch numbers: rows are read by
  index (from a :class:`~jaxtl.data.row_store.RowStore` on disk, or arrays
  in memory), and with ``workers`` > 0 the reading and the objective's
  corruption run in that many worker processes. The state is the position
  of the next batch the consumer gets, ``(epoch, index)``, whatever Grain
  has made ahead, so a run resumes exactly with any number of workers or
  processes.

  With ``partners`` (an objective whose ``Prepared.partner`` is set) each
  example also gets a random row of the split, drawn with its generator,
  and both rows carry the number of the document they start in. A
  ``make_batch`` (``Prepared.make_batch``: ``make_example`` of stacked rows
  at once, the same examples) is used instead of ``make_example`` when given.
  With ``lengths`` (one per row) a shuffled epoch's batches are each made of
  rows of similar length (:func:`grouped_order`), for batches cut to their
  longest row. ``arrange`` (a generator -> a shuffled epoch's order of all
  rows) sets another order, e.g. :func:`jaxtl.tasks.packing.balanced_order`.
  """

  def __init__(self, rows: Rows | row_store.RowStore | row_store.ArrayRows,
               make_example: Callable[..., Example], *,
               batch_size: int, seed: int, shuffle: bool = True,
               repeat: bool = True, process_index: int = 0,
               process_count: int = 1, stream: tuple[int, ...] = (),
               workers: int = 0, partners: bool = False,
               make_batch: Callable[..., Example] | None = None,
               lengths: np.ndarray | None = None,
               arrange: Callable[[np.random.Generator], np.ndarray] | None = None):
    if batch_size % process_count:
      raise ValueError(f"global batch size {batch_size} is not divisible by "
                       f"the {process_count} processes")
    if isinstance(rows, Mapping):
      rows = row_store.ArrayRows(dict(rows))
    self.rows = rows
    self.num_rows = len(rows)
    if self.num_rows < batch_size:
      raise ValueError(f"only {self.num_rows} rows, fewer than one batch of "
                       f"{batch_size}")
    self.make_example = make_example
    self.batch_size, self.seed, self.stream = batch_size, seed, tuple(stream)
    self.shuffle, self.repeat, self.workers = shuffle, repeat, workers
    self.local = batch_size // process_count
    self.offset = process_index * self.local
    self.batches_per_epoch = self.num_rows // batch_size
    self.epoch, self.index = 0, 0
    if partners:  # the document index, made here rather than in each worker
      rows.first_documents()
    if lengths is not None:
      if len(lengths) != self.num_rows:
        raise ValueError(f"{len(lengths)} lengths for {self.num_rows} rows")
      if arrange is not None:
        raise ValueError("BatchIterator takes lengths (grouped batches) or arrange, "
                         "not both")
      arrange = functools.partial(grouped_order, lengths=np.asarray(lengths),
                                  batch_size=batch_size)
    self._batches = _Batch(rows, make_example, batch_size, self.local, self.offset,
                           self.batches_per_epoch, seed, shuffle, self.stream,
                           partners, make_batch, arrange)
    self._it = None

  def epoch_rows(self, epoch: int) -> np.ndarray:
    """The rows of each (global) batch of ``epoch``: [batches, batch_size]."""
    n = self.batches_per_epoch * self.batch_size
    return self._batches.order(epoch)[:n].reshape(-1, self.batch_size)

  def get_state(self) -> dict[str, int]:
    return {"epoch": self.epoch, "index": self.index}

  def set_state(self, state: Mapping[str, int]) -> None:
    self.epoch, self.index = int(state["epoch"]), int(state["index"])
    self.close()

  def open(self) -> None:
    """Makes Grain's iterator now, on the calling thread, where ``next``
    would make it at its first call. A :class:`Prefetcher` calls it before
    its thread starts, so that Grain (and the JAX modules it loads) is not
    imported there while the loop's other threads trace and import: a run
    set up that way once failed with a ModuleNotFoundError for an installed
    module (seen once; this removes the concurrency, the cause is unproven)."""
    if self._it is None:
      self._it = self._start()

  def _start(self) -> Iterator[Example]:
    """Grain's iterator from the current position on."""
    # heavy: Grain imports JAX (~1 s); the data layer loads without it
    import grain  # pylint: disable=g-import-not-at-top
    start = self.epoch * self.batches_per_epoch + self.index
    stop = sys.maxsize if self.repeat else self.batches_per_epoch
    ds = grain.MapDataset.range(start, stop).map(self._batches)
    if self.workers:
      if not flags.FLAGS.is_parsed():  # Grain's workers read its absl flags
        flags.FLAGS.mark_as_parsed()  # (defaults) unless absl parsed argv
      it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0)).mp_prefetch(
          grain.MultiprocessingOptions(num_workers=self.workers,
                                       per_worker_buffer_size=2))
    else:  # made on demand, in the consumer's thread (see Prefetcher)
      it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    return iter(it)

  def __iter__(self) -> Iterator[Example]:
    return self

  def __next__(self) -> Example:
    if self.index >= self.batches_per_epoch:
      if not self.repeat:
        raise StopIteration
      self.epoch, self.index = self.epoch + 1, 0
    if self._it is None:
      self._it = self._start()
    batch = next(self._it)
    self.index += 1
    return batch

  def close(self) -> None:
    """Stops Grain's workers (a later ``next`` starts them again)."""
    if self._it is not None and hasattr(self._it, "close"):
      self._it.close()
    self._it = None


_NOTHING = object()


class Prefetcher:
  """Makes batches in a background thread, ahead of the training step.

  ``get_state`` reports the position of the next batch the *consumer* will
  get, not of the producer, so checkpoints resume exactly.
  """

  def __init__(self, iterator: BatchIterator, size: int = 2):
    self.iterator = iterator
    self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
    self._state = iterator.get_state()
    self._held: Any = _NOTHING  # an item peek took from the queue, for next
    self._stop = threading.Event()
    if hasattr(iterator, "open"):  # Grain's iterator made on this thread (open)
      iterator.open()
    self._thread = threading.Thread(target=self._produce, daemon=True)
    self._thread.start()

  def _produce(self) -> None:
    try:
      while not self._stop.is_set():
        item = next(self.iterator)
        self._queue.put((item, self.iterator.get_state()))
    except StopIteration:
      self._queue.put(None)
    except Exception as e:  # pylint: disable=broad-except
      self._queue.put(e)

  def get_state(self) -> dict[str, int]:
    return dict(self._state)

  def __iter__(self) -> Iterator[Example]:
    return self

  def __next__(self) -> Example:
    item = self._queue.get() if self._held is _NOTHING else self._held
    self._held = _NOTHING
    if item is None:
      raise StopIteration
    if isinstance(item, Exception):
      raise item
    batch, self._state = item
    return batch

  def peek(self) -> Example | None:
    """The batch ``next`` will return, waiting for it, and left for
    ``next`` (None at the end of the batches or when making it failed:
    ``next`` raises then). For one other thread (the loop's step compiled
    ahead) while the consumer does not take batches yet."""
    if self._held is _NOTHING:
      self._held = self._queue.get()
    return None if self._held is None or isinstance(self._held, Exception) else self._held[0]

  def close(self) -> None:
    """Stops the thread, then the iterator's own workers (Grain's)."""
    self._stop.set()
    while self._thread.is_alive():  # a put may wait for room: make it
      while not self._queue.empty():
        self._queue.get_nowait()
      self._thread.join(timeout=0.05)
    with contextlib.suppress(queue.Full):  # wakes a peek still waiting: no batch comes
      self._queue.put_nowait(None)
    if hasattr(self.iterator, "close"):
      self.iterator.close()
