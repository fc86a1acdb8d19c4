"""jaxtl: transfer learning for NLP in JAX/Flax."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load(workdir: str, compute_dtype: str | None = None) -> Any:
  """The fine-tuned model in ``workdir`` (:class:`jaxtl.tasks.predictor.FineTuned`),
  ready to ``.predict(texts)``. ``compute_dtype`` (auto, float32, bfloat16;
  None: as fine-tuning was asked): see :func:`jaxtl.tasks.predictor.load`.

  Imported on call, so ``import jaxtl`` stays light (no JAX, no Flax).
  """
  # heavy: JAX and Flax; ``import jaxtl`` (and every jaxtl.runtime import, before
  # the CLI tunes the process for JAX) must not load them
  from jaxtl.tasks import predictor  # pylint: disable=g-import-not-at-top
  return predictor.load(workdir, compute_dtype)
