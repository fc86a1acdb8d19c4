"""The container task readers return, and their shared bad-row policy.

Kept apart from the readers (`tasks.py`, `squad.py`) so both can share the
`on_error` handling without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxtl.data import row_files

ON_ERROR = ("raise", "skip")


@dataclasses.dataclass
class Examples:
  """One split of a classification, regression or tagging task.

  Attributes:
    texts: The (first) input text of each example. For tagging, the words
      joined by single spaces, for display; models should use `words`.
    labels: Class ids (int), scores (float, regression), or for tagging one
      tag id per word.
    label_names: Class names indexed by class id; None for regression.
    text_pairs: The second text of sentence-pair tasks, else None.
    words: For tagging, each sentence's words, else None.
    path: The file read, for messages.
    skipped_rows: "file:line: reason" for each row dropped with
      on_error="skip".
    lines: Where each example was read ("file:line"), for messages; None
      when the reader does not say.
  """
  texts: list[str]
  labels: list[Any]
  label_names: tuple[str, ...] | None = None
  text_pairs: list[str] | None = None
  words: list[list[str]] | None = None
  path: str = ""
  skipped_rows: list[str] = dataclasses.field(default_factory=list)
  lines: list[str] | None = None

  def __post_init__(self):
    for name in ("labels", "text_pairs", "words", "lines"):
      value = getattr(self, name)
      if value is not None and len(value) != len(self.texts):
        raise ValueError(f"{len(self.texts)} texts but {len(value)} {name}")
    if self.label_names is not None:
      self._check_class_ids()

  def _check_class_ids(self) -> None:
    """Every class (or tag) id indexes ``label_names``.

    An id past the head's classes makes a NaN loss that fine-tuning skips
    as a bad step, and -1 silently picks the last class: both are data
    errors, named here by file and line before any training.
    """
    n = len(self.label_names)
    for i, label in enumerate(self.labels):
      ids = label if isinstance(label, (list, tuple, np.ndarray)) else (label,)
      for x in ids:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) \
            or not 0 <= x < n:
          where = self.lines[i] if self.lines else f"{self.path or 'examples'}: " \
              f"example {i}"
          raise ValueError(f"{where}: label {x!r} is not a class id of the {n} "
                           f"classes {tuple(self.label_names)} (0..{n - 1})")

  def __len__(self) -> int:
    return len(self.texts)

  def subset(self, indices: Any) -> "Examples":
    """The examples at ``indices``, in that order (a sample or a split)."""
    pick = lambda xs: None if xs is None else [xs[i] for i in indices]
    return Examples(texts=pick(self.texts), labels=pick(self.labels),
                    label_names=self.label_names, text_pairs=pick(self.text_pairs),
                    words=pick(self.words), path=self.path, lines=pick(self.lines))

  def sample(self, n: int, seed: int) -> "Examples":
    """A random ``n`` of the examples; see :func:`sample`."""
    return sample(self, n, seed)

  def split_off(self, fraction: float, seed: int) -> tuple["Examples", "Examples"]:
    """(rest, held out): a random ``fraction`` (at least one example) held
    out by ``seed``, both in file order; the rest keeps the skipped rows.
    How dev (or test) is made for tasks that come without one."""
    order = np.random.default_rng(seed + 12345).permutation(len(self))
    n_held = max(1, int(round(len(self) * fraction)))
    rest = self.subset(np.sort(order[n_held:]))
    rest.skipped_rows = list(self.skipped_rows)
    return rest, self.subset(np.sort(order[:n_held]))

  @property
  def skipped(self) -> int:
    """How many rows were dropped as bad."""
    return len(self.skipped_rows)


class BadRows:
  """Applies a reader's on_error policy: raise at once, or record and go on.

  Raising is the default because a silently shortened training set is
  worse than a crash; "skip" is for messy custom files, and the recorded
  messages let the caller say how many rows it lost and where.
  """

  def __init__(self, on_error: str):
    if on_error not in ON_ERROR:
      raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    self.raise_errors = on_error == "raise"
    self.skipped: list[str] = []

  def bad(self, where: str, reason: str) -> None:
    message = f"{where}: {reason}"
    if self.raise_errors:
      raise ValueError(message)
    self.skipped.append(message)


def iter_lines(path: str, encoding: str,
               rows: BadRows) -> Iterator[tuple[int, str]]:
  """Yields (1-based line number, text without line break) of non-blank lines.

  Decoding line by line lets an undecodable line be named (or skipped).
  """
  return row_files.read_lines(path, rows.bad, encoding=encoding)


def sample(examples: Any, n: int, seed: int) -> Any:
  """A random ``n`` of ``examples`` (all of them when there are fewer), in
  file order, its skipped rows still counted: for anything with ``subset``
  and ``skipped_rows`` (``Examples``, SQuAD's ``SquadExamples``)."""
  if n >= len(examples):
    return examples
  order = np.random.default_rng(seed).permutation(len(examples))
  out = examples.subset(np.sort(order[:n]))
  out.skipped_rows = list(examples.skipped_rows)
  return out
