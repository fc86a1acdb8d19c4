"""Property tests for jaxtl.data.packing."""

import numpy as np
import pytest

from jaxtl.data import packing

PAD = 0


def _random_examples(rng, n, max_in, max_tgt):
  return [{
    "inputs": rng.integers(1, 500, size=int(rng.integers(0, max_in))),
    "targets": rng.integers(1, 500, size=int(rng.integers(0, max_tgt))),
    "ignored": np.arange(3),
  } for _ in range(n)]


def _unpack(batch, name):
  """Yields each segment's tokens, row by row, in segment order."""
  tokens, seg = batch[name], batch[f"{name}_segment_ids"]
  for r in range(tokens.shape[0]):
    for s in np.unique(seg[r][seg[r] > 0]):
      yield r, s, tokens[r][seg[r] == s]


def _check_layout(batch, lengths):
  for name, length in lengths.items():
    tokens = batch[name]
    seg = batch[f"{name}_segment_ids"]
    pos = batch[f"{name}_positions"]
    assert tokens.shape == seg.shape == pos.shape
    assert tokens.shape[1] == length
    assert tokens.dtype == seg.dtype == pos.dtype == np.int32
    # Padding: segment 0, position 0, pad id; real tokens come first.
    assert (tokens[seg == 0] == PAD).all() and (pos[seg == 0] == 0).all()
    for row_seg, row_pos in zip(seg, pos):
      real = row_seg > 0
      n = int(real.sum())
      assert real[:n].all()
      assert (np.diff(row_seg[:n]) >= 0).all()  # Segments are contiguous.
      for s in np.unique(row_seg[:n]):
        np.testing.assert_array_equal(row_pos[row_seg == s],
                                              np.arange((row_seg == s).sum()))


def test_chunk_stream_covers_stream_in_order():
  rng = np.random.default_rng(0)
  for trial in range(50):
    docs = [rng.integers(3, 100, size=int(rng.integers(0, 40)))
        for _ in range(int(rng.integers(0, 20)))]
    length = int(rng.integers(1, 33))
    eos = None if trial % 2 else 1
    stream = np.concatenate(
      [np.append(d, eos) if eos is not None else d for d in docs] +
      [np.zeros(0, np.int64)]).astype(np.int32)
    rows = packing.chunk_stream(docs, length, eos_id=eos)
    assert rows.dtype == np.int32 and rows.shape == (stream.size // length,
                                                         length)
    np.testing.assert_array_equal(rows.ravel(), stream[:rows.size])
    rows = packing.chunk_stream(docs, length, eos_id=eos,
                  drop_remainder=False, pad_id=-1)
    assert rows.shape[0] == -(-stream.size // length)
    np.testing.assert_array_equal(rows.ravel()[:stream.size], stream)
    assert (rows.ravel()[stream.size:] == -1).all()


def test_chunk_stream_empty():
  assert packing.chunk_stream([], 8, eos_id=1).shape == (0, 8)


def test_pad_to():
  np.testing.assert_array_equal(packing.pad_to(np.array([5, 6]), 4),
                                  [5, 6, 0, 0])
  np.testing.assert_array_equal(packing.pad_to(np.arange(1, 7), 4, pad_id=9),
                                  [1, 2, 3, 4])
  np.testing.assert_array_equal(packing.pad_to([], 2, pad_id=7), [7, 7])
  assert packing.pad_to(np.array([1], np.int64), 3).dtype == np.int32


@pytest.mark.parametrize("seed", range(5))
def test_pack_sequences_roundtrip(seed):
  rng = np.random.default_rng(seed)
  lengths = {"inputs": 64, "targets": 16}
  examples = _random_examples(rng, 300, 80, 20)
  batch = packing.pack_sequences(examples, lengths, pad_id=PAD)
  assert set(batch) == {f"{f}{s}" for f in lengths
                          for s in ("", "_segment_ids", "_positions")}
  _check_layout(batch, lengths)
  kept = [ex for ex in examples
      if ex["inputs"].size or ex["targets"].size]
  for name, length in lengths.items():
    unpacked = list(_unpack(batch, name))
    nonempty = [ex[name][:length] for ex in kept if ex[name].size]
    assert len(unpacked) == len(nonempty)
    for (_, _, got), want in zip(unpacked, nonempty):
      np.testing.assert_array_equal(got, want)
  # Both features of an example share a row and segment id, in stream order.
  places = []
  for r in range(batch["inputs"].shape[0]):
    segs = np.union1d(batch["inputs_segment_ids"][r],
                          batch["targets_segment_ids"][r])
    places += [(r, s) for s in segs if s > 0]
  assert places == sorted(places) and len(places) == len(kept)
  for (r, s), ex in zip(places, kept):
    for name, length in lengths.items():
      got = batch[name][r][batch[f"{name}_segment_ids"][r] == s]
      np.testing.assert_array_equal(got, ex[name][:length])
  # Sequential packing: the next row's first example did not fit in this one.
  fill = {f: (batch[f"{f}_segment_ids"] > 0).sum(1) for f in lengths}
  first = {}
  for (r, s), ex in zip(places, kept):
    first.setdefault(r, ex)
  for r in range(1, batch["inputs"].shape[0]):
    assert any(fill[f][r - 1] + min(first[r][f].size, n) > n
                   for f, n in lengths.items())


def test_pack_sequences_is_dense_for_small_examples():
  examples = [{"x": np.full(3, i + 1)} for i in range(10)]
  batch = packing.pack_sequences(examples, {"x": 8})
  np.testing.assert_array_equal(batch["x"], [[1, 1, 1, 2, 2, 2, 0, 0],
                                               [3, 3, 3, 4, 4, 4, 0, 0],
                                               [5, 5, 5, 6, 6, 6, 0, 0],
                                               [7, 7, 7, 8, 8, 8, 0, 0],
                                               [9, 9, 9, 10, 10, 10, 0, 0]])
  np.testing.assert_array_equal(batch["x_segment_ids"][0],
                                  [1, 1, 1, 2, 2, 2, 0, 0])
  np.testing.assert_array_equal(batch["x_positions"][0],
                                  [0, 1, 2, 0, 1, 2, 0, 0])


def test_pack_sequences_edge_cases():
  out = packing.pack_sequences([], {"x": 4})
  assert out["x"].shape == (0, 4) and out["x_positions"].shape == (0, 4)
  out = packing.pack_sequences([{"x": np.arange(1, 10)}], {"x": 4})
  np.testing.assert_array_equal(out["x"], [[1, 2, 3, 4]])
  with pytest.raises(ValueError, match="targets"):
    packing.pack_sequences([{"inputs": np.arange(3)}],
                               {"inputs": 4, "targets": 4})


def test_pad_batch_matches_one_example_per_row():
  rng = np.random.default_rng(9)
  lengths = {"inputs": 32, "targets": 8}
  examples = _random_examples(rng, 100, 40, 12)
  batch = packing.pad_batch(examples, lengths, pad_id=PAD)
  _check_layout(batch, lengths)
  for name, length in lengths.items():
    assert batch[name].shape == (len(examples), length)
    for r, ex in enumerate(examples):
      want = ex[name][:length]
      np.testing.assert_array_equal(batch[name][r],
                                          packing.pad_to(want, length, PAD))
      np.testing.assert_array_equal(batch[f"{name}_segment_ids"][r],
                                          np.arange(length) < want.size)
      np.testing.assert_array_equal(
        batch[f"{name}_positions"][r],
        np.where(np.arange(length) < want.size, np.arange(length), 0))
    # Same as packing each example alone.
    for r, ex in enumerate(examples[:10]):
      if ex["inputs"].size or ex["targets"].size:
        alone = packing.pack_sequences([ex], lengths, pad_id=PAD)
        for key in (name, f"{name}_segment_ids", f"{name}_positions"):
          np.testing.assert_array_equal(alone[key][0], batch[key][r])


@pytest.mark.parametrize("eos", [None, 1])
def test_blocks_on_a_stream_equal_the_whole_at_once(eos):
  rng = np.random.default_rng(0)
  docs = [rng.integers(2, 50, size=rng.integers(0, 30)) for _ in range(300)]
  whole = packing.chunk_stream(docs, 16, eos_id=eos)
  blocks = list(packing.chunk_blocks(iter(docs), 16, eos_id=eos, block_tokens=40))
  assert len(blocks) > 10
  np.testing.assert_array_equal(np.concatenate(blocks), whole)
  packed = packing.pack_sequences([{"tokens": d} for d in docs], {"tokens": 16})
  blocks = list(packing.pack_blocks(iter(docs), 16, block_docs=7))
  assert len(blocks) > 10
  for key, value in packed.items():
    np.testing.assert_array_equal(np.concatenate([b[key] for b in blocks]), value)


@pytest.mark.parametrize("size,length", [(0, 4), (3, 4), (4, 4), (6, 4)])
def test_pad_one_is_pad_batchs_row(size, length):
  seq = np.arange(1, size + 1)
  batch = packing.pad_batch([{"x": seq}], {"x": length}, pad_id=9)
  got = packing.pad_one(seq, length, pad_id=9)
  for want, have in zip((batch["x"][0], batch["x_segment_ids"][0], batch["x_positions"][0]), got):
    np.testing.assert_array_equal(have, want)
    assert have.dtype == np.int32
