"""Pretraining objectives, registered by name once.

Adding an objective is one new module here that defines an
:class:`~jaxtl.objectives.base.Objective` (its family and how a row becomes
an example), and one entry in ``REGISTRY`` below; the pipeline, the loss,
the loop and the config checks then take it by ``config.objective.name``.
"""

from typing import Any

from jaxtl.objectives import bart, clm, electra, mlm, nsp, prefix_lm, span
from jaxtl.objectives.base import Objective, ObjectiveConfig, Prepared
from jaxtl.objectives.losses import (LOSS_CHUNK_LEN, chunked_cross_entropy, forward,
                                     loss_weight_total, make_loss_fn, normalized_loss,
                                     summarize, token_cross_entropy)

REGISTRY: dict[str, Objective] = {o.name: o for o in (
    clm.OBJECTIVE, mlm.OBJECTIVE, nsp.NSP, nsp.SOP, span.OBJECTIVE, electra.OBJECTIVE,
    bart.OBJECTIVE, prefix_lm.OBJECTIVE, prefix_lm.ENCDEC_OBJECTIVE)}
ObjectiveConfig.KINDS.update({name: o.config for name, o in REGISTRY.items()})


def get(name: str) -> Objective:
  """The objective called ``name`` (config.objective.name)."""
  if name not in REGISTRY:
    raise ValueError(f"unknown objective {name!r} (config.objective.name); known: "
                     + ", ".join(f"{o.name} ({o.description})" for o in REGISTRY.values()))
  return REGISTRY[name]


def check_objective(name: str, family: str, where: str = "config.model.family") -> None:
  """Fails early, naming both, when an objective is paired with the wrong model."""
  get(name).check_family(family, where)


def check_model(name: str, model: Any, where: str = "config.model") -> None:
  """Fails early when the model (a TransformerConfig) lacks what the
  objective needs (NSP's token types and sentence head)."""
  get(name).check_model(model, where)


__all__ = ["LOSS_CHUNK_LEN", "Objective", "ObjectiveConfig", "Prepared", "REGISTRY", "check_model",
           "check_objective",
           "chunked_cross_entropy", "forward", "get", "loss_weight_total",
           "make_loss_fn", "normalized_loss", "summarize",
           "token_cross_entropy"]
