"""Weighted mixtures of corpora: how many documents each part gives a split.

A mixture source (``kind="mixture"``) names its ``parts`` and a ``mixing``
mode:

- ``"concat"`` (the default): every document of every part, parts in name
  order; what a mixture always was.
- ``"rates"``: each part carries a ``rate`` (any non-negative number,
  default 1; they are normalised), and part ``i`` makes up ``rate_i / sum(rate)`` of the
  split's documents.
- ``"proportional"``: T5's examples-proportional mixing, ``rate_i ∝
  min(n_i, cap) ** (1 / temperature)`` with ``n_i`` the part's documents
  (``cap`` 0: no cap). ``temperature`` 1 without a cap is concatenation's
  shares; a cap keeps a huge corpus from drowning the others, a higher
  temperature flattens the shares towards uniform.

The unit is the document (the reader's example), as T5 mixes examples and
before any tokenization: sources stay tokenizer-free and a share is read
straight off the config. A part of long documents therefore gives more
tokens than its share of documents; weight it down if tokens matter.

A weighted split keeps concatenation's size (the parts' documents added
up) and draws from part ``i`` exactly ``round(share_i * size)`` documents
(largest remainders, so the counts add up): the whole part as many times
as it fits, then a seeded subset of it (every document once before any
twice). The parts' documents are then interleaved in a seeded order.
Quotas instead of independent draws make the realised shares the
configured ones, not a sample of them; a pure function of ``(seed, split,
config)`` makes the rows, hence the batch iterator's saved ``(epoch,
index)``, resume exactly.

The parts stream: a part is read once to count its documents and then as
often as it is repeated, each document kept or not by a mask of one byte
per document, so a mixture of corpora larger than memory mixes in flat
memory. Within a part, documents keep their file order (training shuffles
the rows cut from them).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import numpy as np

log = logging.getLogger(__name__)
T = TypeVar("T")

MODES: Sequence[str] = ("concat", "rates", "proportional")


def shares(sizes: Mapping[str, int], mixing: str, *, rates: Mapping[str, float]
           | None = None, cap: int = 0, temperature: float = 1.0
           ) -> dict[str, float]:
  """Each part's share of the split's documents (they add up to 1).

  Args:
    sizes: Documents per part (the parts that have the split).
    mixing: One of `MODES`.
    rates: Per-part rates, for ``"rates"``.
    cap: For ``"proportional"``: sizes above it count as ``cap`` (0: none).
    temperature: For ``"proportional"``: rates are raised to ``1 / T``.
  """
  if mixing == "rates":
    weights = {name: float(rates[name]) for name in sizes}
    if not sum(weights.values()) > 0:
      raise ValueError(f"source.parts.*.rate: all rates are 0 (parts "
                       f"{sorted(sizes)}); at least one must be > 0")
  else:
    weights = {name: float(min(n, cap) if cap else n) ** (1.0 / temperature)
               for name, n in sizes.items()}
    if not sum(weights.values()) > 0:
      raise ValueError(f"every part of the mixture is empty: {dict(sizes)}")
  total = sum(weights.values())
  return {name: w / total for name, w in weights.items()}


def quotas(share: Mapping[str, float], size: int) -> dict[str, int]:
  """Documents per part: ``share * size`` rounded so that they add up to
  ``size`` (largest remainders, ties to the earlier name)."""
  exact = {name: s * size for name, s in share.items()}
  counts = {name: int(math.floor(x)) for name, x in exact.items()}
  left = size - sum(counts.values())
  for name in sorted(exact, key=lambda n: (counts[n] - exact[n], n))[:left]:
    counts[name] += 1
  return counts


# How much more text than its parts hold together a weighted split may
# read. Shares count documents, so a part of a few long documents given an
# equal share beside many short ones (a novel as one document beside 75,000
# reviews) would repeat thousands of times, and the run would fail for
# memory instead of with a message.
MAX_GROWTH = 10.0


def check_growth(sizes: Mapping[str, int], characters: Mapping[str, int],
                 share: Mapping[str, float], split: str) -> None:
  """Refuses shares that would make the split more than `MAX_GROWTH` times
  the text of its parts (``characters``: each part's), naming the part."""
  counts = quotas(share, sum(sizes.values()))
  drawn = {n: counts[n] * characters[n] / sizes[n] for n in sizes if sizes[n]}
  whole = max(sum(characters.values()), 1)
  if sum(drawn.values()) <= MAX_GROWTH * whole:
    return
  worst = max(drawn, key=drawn.get)
  raise ValueError(
      f"mixture {split!r} split: {worst!r} has {sizes[worst]:,} document(s) of "
      f"{characters[worst] / sizes[worst]:,.0f} characters on average, and its "
      f"share of {share[worst]:.1%} of the split's {sum(sizes.values()):,} documents "
      f"would repeat it {counts[worst] / sizes[worst]:,.0f} times: "
      f"{sum(drawn.values()) / whole:,.0f}x the text of the parts together. Rates "
      f"are shares of documents: lower source.parts.{worst}.rate, or cut its "
      "files into more documents")


def _rng(seed: int, split: str, name: str) -> np.random.Generator:
  """A generator for (seed, split, part name): adding a part or renaming
  another leaves the documents drawn from this one unchanged."""
  digest = hashlib.sha256(f"{split}\0{name}".encode()).digest()
  return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


def draw(texts: Callable[[], Iterable[T]], size: int, count: int,
         rng: np.random.Generator) -> Iterator[T]:
  """``count`` documents of a part of ``size`` (``texts()`` streams it):
  whole passes in file order, then a seeded subset (every document once
  before any twice)."""
  if count and not size:
    raise ValueError("an empty part cannot give documents")
  passes, rest = divmod(count, size) if size else (0, 0)
  keep = np.zeros(size, bool)
  keep[rng.permutation(size)[:rest]] = True
  for _ in range(passes):
    yield from texts()
  if rest:
    yield from itertools.compress(texts(), keep)


def mix(parts: Mapping[str, Callable[[], Iterable[T]]], sizes: Mapping[str, int],
        share: Mapping[str, float], *, seed: int, split: str) -> Iterator[T]:
  """The split's documents, ``share`` of them from each part, interleaved in
  a seeded order; as many as the parts hold together (``sizes``)."""
  size = sum(sizes.values())
  counts = quotas(share, size)
  names = sorted(parts)
  for name in names:
    if counts[name] and not sizes[name]:
      raise ValueError(f"mixture part {name!r} has no {split!r} documents but a "
                       f"share of {share[name]:.1%}")
  drawn = {name: draw(parts[name], sizes[name], counts[name], _rng(seed, split, name))
           for name in names}
  labels = np.concatenate([np.full(counts[n], i, np.int16) for i, n in enumerate(names)])
  labels = _rng(seed, split, "").permutation(labels)
  log.info("mixture %s split (%d documents, seed %d): %s", split, size, seed,
           ", ".join(f"{n} {share[n]:.1%} ({counts[n]} of its {sizes[n]}, "
                     f"x{counts[n] / max(sizes[n], 1):.2f})" for n in names))
  for i in labels:
    yield next(drawn[names[i]])
