"""What a pretraining objective is: one object that the pipeline, the loss
and the training loop all ask, instead of each branching on its name.

An :class:`Objective` says which model family it trains and, given the
tokenizer and the config, how a row of token ids becomes one example with
t5x feature names (:class:`Prepared`). The loss is the same weighted token
cross-entropy for most objectives (:mod:`jaxtl.objectives.losses`), which
then only choose which positions carry weight; one that trains more than
the model itself (ELECTRA's generator) brings its module and loss too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Sequence

import flax.linen as nn
import numpy as np

from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import transformer
from jaxtl.models.config import TransformerConfig
from jaxtl.models.family import family_of
from jaxtl import sections
from jaxtl.data.config import DataConfig
from jaxtl.objectives import losses
from jaxtl.sections import key

@dataclasses.dataclass(frozen=True)
class ObjectiveConfig(sections.Kinded):
  """The pretraining objective (config.objective): what every objective
  reads; an objective with settings of its own has a subclass of this."""
  KIND_KEY: ClassVar[str] = "name"
  KINDS: ClassVar[dict[str, type]] = {}  # jaxtl.objectives.REGISTRY's classes
  name: str = key("clm", "pretraining objective")
  loss_chunk_len: int = key(losses.LOSS_CHUNK_LEN,
                            "positions whose logits exist at once in the loss (less "
                            "memory); 0: all")


Example = dict[str, np.ndarray]
Row = Mapping[str, np.ndarray]  # "tokens", "segment_ids", "positions": [L]
Rows = Mapping[str, np.ndarray]  # the same, stacked: [B, L]
MakeBatch = Callable[[Rows, Sequence[np.random.Generator]], Example]


@dataclasses.dataclass(frozen=True)
class Prepared:
  """An objective bound to a tokenizer and a sequence length.

  Attributes:
    make_example: ``(row, rng) -> example``, a pure function of its inputs
      (the pipeline makes the rng from (seed, epoch, example id)).
    lengths: the batch's length per side, e.g. ``{"encoder": 128}``.
    row_length: tokens per row cut from the corpus, before framing.
    eos: whether documents end with EOS before packing.
    framed: whether chunked rows get [CLS] ... [SEP] around them.
    max_predictions: a bound on loss positions per row (the loss computes
      logits only there), or None for every position.
    partner: whether ``make_example`` takes a second row, ``(row, rng,
      partner)``: a random row of the split, both rows numbered by document
      (``row["document"]``), for NSP's negatives from the whole corpus.
    make_batch: optionally, ``(rows, rngs[, partners]) -> batch``:
      ``make_example`` of each of the stacked rows with its generator (and
      partner), stacked, made at once with array operations (several times
      cheaper per row on the host); ``make_example`` is then its batch of
      one (:func:`one_row`).
  """
  make_example: Callable[[Row, np.random.Generator], Example]
  lengths: dict[str, int]
  row_length: int
  eos: bool
  framed: bool = False
  max_predictions: int | None = None
  partner: bool = False
  make_batch: MakeBatch | None = None


def one_row(make_batch: MakeBatch) -> Callable[..., Example]:
  """The ``make_example`` of a ``make_batch``: its batch of one row (and of
  the row's partner, for an objective that takes one)."""

  def make_example(row: Row, rng: np.random.Generator, *partner: Row) -> Example:
    stack = lambda r: {k: np.asarray(v)[None] for k, v in r.items()}
    batch = make_batch(stack(row), [rng], *(stack(p) for p in partner if p is not None))
    return {k: v[0] for k, v in batch.items()}

  return make_example


def plain_model(config: TransformerConfig, objective: ObjectiveConfig) -> nn.Module:  # pylint: disable=unused-argument
  return transformer.build_model(config)


def token_loss(model: nn.Module, max_predictions: int | None,
               objective: ObjectiveConfig) -> losses.LossFn:
  return losses.make_loss_fn(model, max_predictions, objective.loss_chunk_len)


@dataclasses.dataclass(frozen=True)
class Objective:
  """A pretraining objective, registered once by name.

  Attributes:
    name: what ``config.objective.name`` says.
    family: the model family it trains.
    prepare: ``(tokenizer, config.objective, config.data) -> Prepared``.
    config: the class of its typed ``config.objective`` section.
    description: one line for error messages and docs.
    build_model: ``(model config, config.objective) -> module`` trained; by
      default the family's model itself (ELECTRA: a generator beside it).
    make_loss_fn: ``(module, max_predictions, config.objective) -> loss_fn``
      (see :func:`jaxtl.objectives.losses.make_loss_fn`).
    weight_total: ``(batch, family) -> normaliser`` of a batch's loss
      (any tree; the loss function reads it).
    model_needs: the least value of each TransformerConfig field it needs
      (NSP: token types and a sentence head).
    summarize: a run's summed loss metrics -> the logged ones: an LM's by
      default; objectives with sums of their own add their metrics, so the
      trainer never needs to know them.
  """
  name: str
  family: str
  prepare: Callable[[Tokenizer, Any, DataConfig], Prepared]
  description: str = ""
  config: type[ObjectiveConfig] = ObjectiveConfig
  build_model: Callable[[TransformerConfig, Any], nn.Module] = plain_model
  make_loss_fn: Callable[[nn.Module, int | None, Any], losses.LossFn] = token_loss
  weight_total: Callable[[Any, str], Any] = losses.loss_weight_total
  model_needs: Mapping[str, int] = dataclasses.field(default_factory=dict)
  summarize: Callable[[Mapping[str, Any]], dict[str, float]] = losses.summarize

  def check_family(self, family: str, where: str = "config.model.family") -> None:
    """Fails early, naming both, when paired with the wrong model (``where``
    says where its family came from)."""
    if family != self.family:
      raise ValueError(f"objective {self.name!r} needs a {self.family!r} model, but "
                       f"{where} is {family!r}")

  def check_model(self, model: Any, where: str = "config.model") -> None:
    """Fails early, naming the field, when the model lacks what it needs."""
    start = family_of(self.family).decoder_start
    if start is not None and model.decoder_start != start:
      # The examples' decoder inputs start from pad (objectives.span); training
      # an EOS-started model (Hugging Face BART) so would teach it another start.
      raise ValueError(f"objective {self.name!r} starts the decoder from {start}, but "
                       f"{where}.decoder_start is {model.decoder_start!r} (Hugging Face "
                       "BART's); continued pretraining of such a model is not supported")
    for field, least in self.model_needs.items():
      if getattr(model, field) < least:
        raise ValueError(f"objective {self.name!r} needs {where}.{field} >= {least}, "
                         f"but it is {getattr(model, field)}")
