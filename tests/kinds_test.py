"""Task kinds: one registered object per head kind, each scoring its outputs."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.models.heads import HEAD_WIDTHS
from jaxtl.tasks import kinds


def test_every_linear_head_is_a_registered_task_kind():
  assert set(HEAD_WIDTHS) < set(kinds.REGISTRY)


def test_an_unknown_kind_names_the_known_ones():
  with pytest.raises(ValueError, match="config.task.kind.*token_classification"):
    kinds.get("tagging")


@pytest.mark.parametrize("name,shape,label_shape", [
    ("classification", (4, 3), (4,)), ("text_to_text", (4, 3), (4,)),
    ("regression", (4,), (4,)), ("span_qa", (4, 6, 2), (4, 2))])
def test_loss_sums_count_only_weighted_rows(name, shape, label_shape):
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 3, label_shape)
  weights = np.ones(label_shape, np.float32)
  weights[3] = 0.0
  batch = {"labels": jnp.asarray(labels, jnp.float32 if name == "regression" else jnp.int32),
           "label_weights": jnp.asarray(weights), "context_mask": jnp.ones((4, 6), bool)}
  kind = kinds.get(name)
  out = jnp.asarray(rng.normal(size=shape), jnp.float32)
  sums = kind.loss_sums(out, batch)
  assert set(sums) == {"loss_sum", "correct_sum", "weight_sum"}
  assert float(sums["weight_sum"]) == weights.sum() and np.isfinite(float(sums["loss_sum"]))
  labels[3] = (labels[3] + 1) % 3  # the zero-weight row's label does not count
  changed = dict(batch, labels=jnp.asarray(labels, batch["labels"].dtype))
  assert float(kind.loss_sums(out, changed)["loss_sum"]) == pytest.approx(
      float(sums["loss_sum"]))
