"""Weighted mixtures: realised shares, determinism from the seed, errors that
name the key, and a run that resumes exactly on one."""

import collections
import dataclasses
import logging
import shutil

import numpy as np
import pytest

from jaxtl.configs import pretrain_clm
from jaxtl.data import mixtures, sources
from jaxtl.data.config import DataConfig
from jaxtl.pretraining import pipeline
from jaxtl.pretraining import config as pretrain_config

SIZES = {"big": 900, "mid": 90, "small": 10}


def _mixture(tmp_path, mixing="rates", **keys):
  """A mixture of three text files of SIZES lines, each line naming its part,
  as a recipe writes it (a dict; `_load` reads it through its typed section)."""
  parts = {}
  for name, n in SIZES.items():
    path = tmp_path / f"{name}.txt"
    path.write_text("".join(f"{name} {i}\n" for i in range(n)))
    parts[name] = {"kind": "text", "files": {"train": [str(path)]}}
  return {"kind": "mixture", "mixing": mixing, "parts": parts, **keys}


def _with_rates(mix, **rates):
  for name, rate in rates.items():
    mix["parts"][name]["rate"] = rate
  return mix


def _load(mix, split="train", seed=0):
  return sources.load_texts(sources.source_config(mix), split, seed=seed)


def _shares(texts):
  counts = collections.Counter(t.split()[0] for t in texts)
  return {name: counts[name] / len(texts) for name in SIZES}


def test_rates_give_their_shares_of_the_documents(tmp_path, caplog):
  mix = _with_rates(_mixture(tmp_path), big=1, mid=2, small=1)
  with caplog.at_level(logging.INFO):
    texts = _load(mix, seed=0)
  assert len(texts) == sum(SIZES.values())  # concatenation's size
  want = {"big": 0.25, "mid": 0.5, "small": 0.25}
  for name, share in _shares(texts).items():
    assert share == pytest.approx(want[name], abs=1 / len(texts))
  # The small part is upsampled: every line before any twice.
  small = collections.Counter(t for t in texts if t.startswith("small"))
  assert len(small) == 10 and max(small.values()) - min(small.values()) <= 1
  assert "small 25.0% (250 of its 10, x25.00)" in caplog.text


def test_proportional_caps_and_flattens_as_t5(tmp_path):
  mix = _mixture(tmp_path, "proportional", cap=100, temperature=2.0)
  got = _shares(_load(mix, seed=0))
  weights = {name: min(n, 100) ** 0.5 for name, n in SIZES.items()}
  total = sum(weights.values())
  for name, share in got.items():
    assert share == pytest.approx(weights[name] / total, abs=1e-3)
  # No cap, temperature 1: concatenation's shares, in a seeded order.
  plain = _load(_mixture(tmp_path, "proportional"), seed=0)
  assert sorted(plain) == sorted(_load(_mixture(tmp_path, "concat")))


def test_the_seed_decides_the_documents_and_their_order(tmp_path):
  mix = _with_rates(_mixture(tmp_path), big=1, mid=1, small=1)
  a = _load(mix, seed=3)
  assert a == _load(mix, seed=3)
  assert a != _load(mix, seed=4)
  # A part's draw is its own: changing another part's rate keeps its
  # documents (a prefix of the same seeded permutation).
  mid = [t for t in a if t.startswith("mid")]
  fewer = _with_rates(_mixture(tmp_path), big=4, mid=1, small=1)
  mid_fewer = [t for t in _load(fewer, seed=3) if t.startswith("mid")]
  assert set(mid_fewer) <= set(mid) and len(mid_fewer) < len(mid)


def test_a_zero_rate_part_is_not_read(tmp_path):
  mix = _with_rates(_mixture(tmp_path), big=1, mid=0, small=1)
  mix["parts"]["mid"]["files"]["train"] = [str(tmp_path / "missing.txt")]
  assert not any(t.startswith("mid") for t in _load(mix))


def test_a_part_without_a_rate_counts_as_rate_1(tmp_path):
  """A part's rate defaults to 1.0 (MixturePart), as a recipe's parts do."""
  mix = _with_rates(_mixture(tmp_path), mid=2)  # big, small: no rate key
  typed = sources.source_config(mix)
  assert [typed.parts[n].rate for n in SIZES] == [1.0, 2.0, 1.0]
  got = _shares(_load(mix))
  for name, share in {"big": 0.25, "mid": 0.5, "small": 0.25}.items():
    assert got[name] == pytest.approx(share, abs=1e-3)


@pytest.mark.parametrize("keys, rates, message", [
    (dict(mixing="weighted"), {}, r"source.mixing='weighted': expected one of concat"),
    ({}, dict(big=1, mid=-1, small=1), r"source.parts.mid.rate=-1: expected a finite"),
    ({}, dict(big=1, mid=1, small=None), r"source.parts.small.rate is not set"),
    ({}, dict(big=1, mid="2", small=1), r"source.parts.mid.rate='2': expected a finite"),
    ({}, dict(big=0, mid=0, small=0), r"source.parts.\*.rate: all rates .* are 0"),
    (dict(mixing="proportional", cap=-5), {}, r"source.cap=-5"),
    (dict(mixing="proportional", temperature=0.0), {}, r"source.temperature=0.0"),
    (dict(cap=10), dict(big=1, mid=1, small=1), r"source.cap / source.temperature .* 'rates'"),
])
def test_bad_settings_name_their_key(tmp_path, keys, rates, message):
  mix = _with_rates(_mixture(tmp_path, **{"mixing": "rates", **keys}), **rates)
  with pytest.raises(ValueError, match=message):
    _load(mix)


def test_a_share_that_would_repeat_a_long_document_thousands_of_times_is_refused(tmp_path):
  """The transfer study's mixture with equal rates: a novel as one document
  beside many short ones would make the split thousands of times its text."""
  mix = _with_rates(_mixture(tmp_path), big=1, mid=1, small=1)
  novel = tmp_path / "novel.txt"
  novel.write_text("a line of a long play\n" * 2000)
  mix["parts"]["small"] = {"kind": "text", "paragraphs": True, "rate": 1,
                           "files": {"train": [str(novel)]}}
  with pytest.raises(ValueError, match=r"'small' has 1 document\(s\) of 44,000 "
                     r"characters .* would repeat it [\d,]+ times: [\d,]+x the text .* "
                     r"lower source.parts.small.rate"):
    _load(mix)
  mix["parts"]["small"]["rate"] = 0.001  # a few copies: allowed
  assert sum(t.startswith("a line") for t in _load(mix)) >= 1


def test_quotas_add_up():
  assert mixtures.quotas({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 10) == {"a": 4, "b": 3, "c": 3}


def test_only_a_weighted_mixtures_rows_depend_on_the_seed(tmp_path):
  class Tok:
    fingerprint = staticmethod(lambda: "tok")
  data = DataConfig(source=sources.source_config(_mixture(tmp_path, "concat")),
                    max_docs=0, packing="chunk")
  key = lambda d, seed: pipeline._cache_key(d, "train", Tok, 16, True, seed)
  assert not sources.is_weighted(data.source)
  assert key(data, 0) == key(data, 1)
  weighted = dataclasses.replace(
      data, source=sources.source_config(_mixture(tmp_path, "proportional")))
  assert sources.is_weighted(weighted.source)
  assert key(weighted, 0) != key(weighted, 1)


def test_a_weighted_mixtures_batches_resume_exactly_from_a_saved_position(tmp_path):
  """What a restart does: a fresh DataSetup (rows rebuilt from the sources,
  no data cache) set to the checkpointed (epoch, index) serves the batches
  the first one would have served next. (The model side of a resume is
  tests/checkpoint_test.py's; a full training run here costs ~40 s.)"""
  config = pretrain_clm.get_config()
  mix = _with_rates(_mixture(tmp_path), big=1, mid=2, small=1)
  mix["parts"]["big"]["files"]["validation"] = mix["parts"]["big"]["files"]["train"]
  with config.unlocked():
    config.data.source = mix
  config.data.tokenizer.update(vocab_size=200, model_type="bpe")
  config.data.update(seq_len=8, batch_size=8)
  first = pipeline.DataSetup(pretrain_config.of(config), str(tmp_path / "run"))
  it = first.train_iterator()
  for _ in range(first.num_rows("train") // 8 + 2):  # into the second epoch
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(3)]
  shutil.rmtree(tmp_path / "run" / "data_cache")
  again = pipeline.DataSetup(pretrain_config.of(config), str(tmp_path / "run")).train_iterator()
  again.set_state(state)
  for batch in want:
    got = next(again)
    for key in batch:
      np.testing.assert_array_equal(got[key], batch[key])
  # The run's seed reaches the mixture: another seed, other rows.
  config.seed = 1
  other = pipeline.DataSetup(pretrain_config.of(config), str(tmp_path / "run"))
  assert not np.array_equal(other.rows_tokens("train"), first.rows_tokens("train"))
