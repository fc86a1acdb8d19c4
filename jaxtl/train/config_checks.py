"""Config values checked before a run writes anything: each value outside
what it allows is one error naming its key (``config.optim.lr=-0.001: must
be ...``), not a NaN loss an hour later or a numpy error deep inside.

The bounds are one table of (key pattern, bound), read by the code that
uses each key; a key a recipe lacks is skipped, so one table serves every
recipe. The loop's own numbers (steps, batch sizes, log_every, ...) are not
here: ``LoopConfig.check`` names them when a run builds its loop.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Callable, Mapping

import ml_collections

from jaxtl.train.identity import leaves
from jaxtl.train.workload import ConfigError

# Sections each mode's config must have, and the recipes that have them.
MODES: dict[str, tuple[tuple[str, ...], str]] = {
    "pretrain": (("data", "objective"), "configs/pretrain_*.py"),
    "finetune": (("task", "adapt"), "configs/finetune*.py"),
    "study": (("pretrain", "finetune", "study"), "configs/transfer_study.py"),
}


@dataclasses.dataclass(frozen=True)
class Bound:
  """What a number must be: ``test`` of one value, and ``text`` saying it."""
  test: Callable[[Any], bool]
  text: str

  def allows(self, value: Any) -> bool:
    """Booleans are not numbers here (``True`` would pass as 1); a tuple
    (a study's grid) is allowed when every entry is."""
    if isinstance(value, (tuple, list)):
      return all(map(self.allows, value))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return False
    return math.isfinite(value) and self.test(value)


def _note(note: str) -> str:
  return f" ({note})" if note else ""


def whole(low: int, note: str = "") -> Bound:
  """A whole number, ``low`` or more."""
  return Bound(lambda v: isinstance(v, int) and v >= low,
               f"a whole number, {low} or more{_note(note)}")


def above(low: float, note: str = "") -> Bound:
  """A finite number above ``low``."""
  return Bound(lambda v: v > low, f"a finite number above {low}{_note(note)}")


def at_least(low: float, note: str = "") -> Bound:
  """A finite number, ``low`` or more."""
  return Bound(lambda v: v >= low, f"a finite number, {low} or more{_note(note)}")


def within(low: float, high: float, *, low_open: bool = False,
           high_open: bool = False, note: str = "") -> Bound:
  """A number between ``low`` and ``high``, each end in or out."""
  def test(v: float) -> bool:
    return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
  ends = ("(" if low_open else "[", ")" if high_open else "]")
  return Bound(test, f"a number in {ends[0]}{low}, {high}{ends[1]}{_note(note)}")


RATE = within(0, 1, high_open=True)  # dropout, Adam's betas, held-out shares
SIZE = whole(1)

# (key pattern, fnmatch-style, relative to a run's config; its bound).
RULES: tuple[tuple[str, Bound], ...] = (
    ("seed", whole(0, "numpy seeds the data order with it")),
    # AdamW and its schedule (jaxtl.train.optim).
    ("optim.lr", above(0)),
    ("optim.warmup_steps", whole(0, "0: warmup_fraction of the steps")),
    ("optim.warmup_fraction", within(0, 1, note="a share of all steps")),
    ("optim.end_lr_ratio", within(0, 1, note="the last step's rate over lr")),
    ("optim.weight_decay", at_least(0)),
    ("optim.b1", RATE),
    ("optim.b2", RATE),
    ("optim.eps", above(0)),
    ("optim.clip_norm", at_least(0, "0: no clipping")),
    # The backbone (TransformerConfig): checked before a tokenizer is trained for it.
    ("model.*dropout*", RATE),
    ("model.vocab_size", whole(0, "0: the tokenizer's")),
    ("vocab_multiple", SIZE),
    ("model.d_model", SIZE),
    ("model.num_heads", SIZE),
    ("model.head_dim", SIZE),
    ("model.mlp_dim", SIZE),
    ("model.num_layers", SIZE),
    ("model.max_len", SIZE),
    ("model.embed_dim", whole(0, "0: d_model")),
    ("model.num_decoder_layers", whole(0, "0: num_layers")),
    ("model.type_vocab_size", whole(0)),
    ("model.adapter_dim", whole(0, "0: none")),
    ("model.lora_rank", whole(0, "0: none")),
    ("model.lora_alpha", above(0)),
    ("model.norm_eps", above(0)),
    ("model.init_std", at_least(0)),
    # Pretraining data and objectives (jaxtl.pretraining.pipeline, jaxtl.objectives).
    ("data.seq_len", whole(3, "room for [CLS], a token and [SEP]")),
    ("data.max_docs", whole(0, "0: all")),
    ("data.prefetch", whole(0)),
    ("data.tokenizer.vocab_size", SIZE),
    ("data.tokenizer.max_sentences", SIZE),
    ("objective.mask_rate", within(0, 1, low_open=True, high_open=True)),
    ("objective.mask_token_rate", within(0, 1)),
    ("objective.random_token_rate", within(0, 1)),
    ("objective.noise_density", within(0, 1, low_open=True, high_open=True)),
    ("objective.mean_noise_span_length", above(0)),
    ("objective.permute_sentence_ratio", within(0, 1)),
    ("objective.generator_scale", within(0, 1, low_open=True)),
    ("objective.generator_layers", whole(0, "0: the discriminator's")),
    ("objective.rtd_weight", at_least(0)),
    ("objective.loss_chunk_len", whole(0, "0: all positions at once")),
    ("train.eval_batches", whole(0, "0: the whole split")),
    ("train.peak_flops", at_least(0, "0: looked up")),
    # Fine-tuning (jaxtl.tasks): the labeled data, the head, the adaptation.
    ("task.max_len", whole(3, "room for [CLS], a token and [SEP]")),
    ("task.dev_fraction", RATE),
    ("task.test_fraction", RATE),
    ("task.num_train_examples", whole(0, "0: all")),
    ("task.max_eval_examples", whole(0, "0: all")),
    ("task.head_dropout", RATE),
    ("task.doc_stride", SIZE),
    ("task.max_answer_tokens", SIZE),
    ("task.max_target_len", SIZE),
    ("task.num_beams", SIZE),
    ("adapt.*dropout*", RATE),
    ("adapt.layer_decay", within(0, 1, low_open=True,
                                 note="each layer's rate over the one above's")),
    ("adapt.unfreeze_epochs", at_least(0, "0: all layers train from the start")),
    ("adapt.adapter_dim", SIZE),
    ("adapt.lora_rank", SIZE),
    ("adapt.lora_alpha", above(0)),
    ("train.length_multiple", whole(0, "0: always max_len")),
    # The transfer study's grid (jaxtl.tools.transfer_study).
    ("study.num_labels", whole(0, "0: every training example")),
    ("study.seeds", whole(0)),
    ("study.min_steps", whole(0)),
    ("study.min_epochs", whole(0)),
    ("study.lr.*", above(0)),
)

# Keys whose sum is bounded too (each is checked alone first).
SUMS: tuple[tuple[tuple[str, str], Bound], ...] = (
    (("task.dev_fraction", "task.test_fraction"), within(0, 1, high_open=True,
                                                         note="train keeps the rest")),
    (("objective.mask_token_rate", "objective.random_token_rate"),
     within(0, 1, note="the rest of the masked positions keep their token")),
    (("study.min_steps", "study.min_epochs"), whole(1, "every run trains")),
)


def check_values(config: ml_collections.ConfigDict, mode: str) -> None:
  """Raises :class:`jaxtl.train.workload.ConfigError` for the first value of
  ``config`` (a ``pretrain``, ``finetune`` or ``study`` config) outside what
  it allows.

  A study's pretraining and fine-tuning configs are checked too, and each
  pretraining stage with its overrides: their runs start hours into a study.
  It reads the recipe as written, before it is typed, so each message
  names the key the user set (``config.stages[1].data.seq_len``).
  """
  for where, run in _runs(config, mode):
    named = _named(run, where)
    _check(named)
    for k, stage in enumerate(run.get("stages") or ()):
      if _is_section(stage):  # else jaxtl.pretraining.config.of names the stage
        overrides = {s: stage[s] for s in ("data", "objective") if s in stage}
        _check({**named, **_named(overrides, f"{where}stages[{k}].")})


def _runs(config: ml_collections.ConfigDict, mode: str) -> list[tuple[str, Any]]:
  """(where, config) of each run ``config`` holds, ``where`` its key prefix."""
  if mode not in MODES:
    raise ValueError(f"mode {mode!r}: expected one of {sorted(MODES)}")
  sections, recipes = MODES[mode]
  for section in sections:
    if section not in config:
      fits = [m for m, (needs, _) in MODES.items() if all(s in config for s in needs)]
      run_it = (f"it is a {fits[0]} recipe: run it with `jaxtl {fits[0]}` (--mode="
                f"{fits[0]})" if fits else "pass the --mode that matches --config")
      raise ConfigError(f"this config has no {section} section, and `jaxtl {mode}` "
                        f"(--mode={mode}) runs {recipes}: {run_it}")
  if mode != "study":
    return [("", config)]
  return [("", {"study": config.study}), ("finetune.", config.finetune),
          *((f"pretrain.{name}.", run) for name, run in config.pretrain.items())]


def _is_section(value: Any) -> bool:
  return isinstance(value, (Mapping, ml_collections.ConfigDict))


def _named(node: Any, where: str) -> dict[str, tuple[str, Any]]:
  """key -> (the name it is shown by, value) of every leaf under ``node``."""
  return {key: (f"config.{where}{key}", value) for key, value in leaves(node)}


def _check(leaves: Mapping[str, tuple[str, Any]]) -> None:
  for pattern, bound in RULES:
    for key in fnmatch.filter(leaves, pattern):
      name, value = leaves[key]
      if not bound.allows(value):
        each = "each " if isinstance(value, (tuple, list)) else ""
        raise ConfigError(f"{name}={value!r}: {each}must be {bound.text}")
  for keys, bound in SUMS:
    if all(k in leaves for k in keys):
      parts = [leaves[k] for k in keys]
      if not bound.allows(sum(value for _, value in parts)):
        raise ConfigError(" + ".join(f"{n}={v!r}" for n, v in parts) +
                          f": together must be {bound.text}")
