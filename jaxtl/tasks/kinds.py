"""Task kinds, registered by name once: how a kind of labeled task becomes
head inputs, a loss, predictions and scores.

Fine-tuning asks the kind named by ``config.task.kind`` instead of branching
on it. Adding a kind is one :class:`TaskKind` here (and, if it needs a new
output shape, a head in :mod:`jaxtl.models.heads`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models.config import TransformerConfig
from jaxtl.models.heads import POOLED_KINDS, best_spans, context_only
from jaxtl.objectives import token_cross_entropy
from jaxtl.tasks import features as task_features
from jaxtl.tasks import generation
from jaxtl.tasks import metrics as task_metrics
from jaxtl.tasks import span_features
from jaxtl.tasks.config import TaskSettings

Array = jax.Array
Batch = Mapping[str, Array]


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """One kind of labeled task.

  Attributes:
    name: what ``config.task.kind`` says (and :class:`~jaxtl.models.heads.TaskModel`'s kind).
    encode: ``(examples, tokenizer, task, model config) -> Features``
      (the model's family lays the inputs out; an encoder-decoder's
      ``decoder_start`` begins generation's decoder inputs).
    loss_sums: ``(head output, batch) -> {loss_sum, correct_sum, weight_sum}``.
    predict: ``(head output, batch, task) -> predictions`` (jitted).
    score: ``(task, predictions, features, examples) -> metrics``.
    infer: ``(head output, batch, task) -> outputs`` (jitted) for users:
      like ``predict``, with class probabilities instead of ids.
    present: ``(task spec, outputs, features, examples) -> one dict per
      example`` in the user's terms (label names, tags per word, answer text).
    too_long: what happens to inputs longer than ``task.max_len``.
    make_loss: ``TaskModel -> loss_fn``, for a kind whose loss is not a
      function of the head's output (generation: the LM's teacher-forced
      loss); None: ``loss_sums`` of the model's output.
    forward: ``(TaskModel, task, tokenizer) -> (params, batch) -> output``,
      replacing the model's own apply where outputs are computed
      (generation: the decoded ids); None: the model's apply.
    weights: the batch feature whose sum normalises the loss.
    counts: what that sum counts, as the training log names it.
    packs: (a property) one output per example, so training may pack a
      batch's examples into shared rows (:mod:`jaxtl.tasks.packing`): the
      kinds whose head pools (:data:`jaxtl.models.heads.POOLED_KINDS`).

  ``task`` is a :class:`~jaxtl.tasks.config.TaskSettings`: the run's
  TaskConfig while fine-tuning, a loaded model's TaskSpec when predicting.
  """
  name: str
  encode: Callable[[Any, Tokenizer, TaskSettings, TransformerConfig],
                   task_features.Features]
  loss_sums: Callable[[Array, Batch], dict[str, Array]] | None
  predict: Callable[[Array, Batch, TaskSettings], Array]
  score: Callable[[TaskSettings, np.ndarray, task_features.Features, Any],
                  dict[str, float]]
  infer: Callable[[Array, Batch, TaskSettings], Array]
  present: Callable[[Any, np.ndarray, task_features.Features, Any], list[dict[str, Any]]]
  too_long: str = "truncated"
  make_loss: Callable[[Any], Callable] | None = None
  forward: Callable[[Any, TaskSettings, Tokenizer], Callable] | None = None
  weights: str = "label_weights"
  counts: str = "examples"

  @property
  def packs(self) -> bool:
    return self.name in POOLED_KINDS


def _encode_sequences(examples, tok, task: TaskSettings, model):
  return task_features.encode_sequences(examples, tok, task.max_len, model.family)


def _encode_tagging(examples, tok, task: TaskSettings, model):
  return task_features.encode_tagging(examples, tok, task.max_len, model.family)


def _encode_spans(examples, tok, task: TaskSettings, model):
  return span_features.encode_spans(examples, tok, task.max_len, model.family,
                                    doc_stride=task.doc_stride)


def _cross_entropy(logits: Array, batch: Batch) -> dict[str, Array]:
  """Classes (or tags) are "tokens" here."""
  return token_cross_entropy(logits, batch["labels"], batch["label_weights"])


def _squared_error(scores: Array, batch: Batch) -> dict[str, Array]:
  w = batch["label_weights"]
  return {"loss_sum": jnp.sum(jnp.square(scores - batch["labels"]) * w),
          "weight_sum": jnp.sum(w), "correct_sum": jnp.zeros(())}


def _gold_text_likelihood(log_p_BC: Array, batch: Batch) -> dict[str, Array]:
  """T5's MLE on the gold label text; [B, C] log p(label text)."""
  labels, w = batch["labels"], batch["label_weights"]
  gold_B = jnp.take_along_axis(log_p_BC, labels[:, None], 1)[:, 0]
  return {"loss_sum": -jnp.sum(gold_B * w), "weight_sum": jnp.sum(w),
          "correct_sum": jnp.sum((jnp.argmax(log_p_BC, -1) == labels) * w)}


def _span_boundaries(logits_BT2: Array, batch: Batch) -> dict[str, Array]:
  """Start and end are "tokens" over the context positions."""
  logits = context_only(jnp.swapaxes(logits_BT2, 1, 2), batch["context_mask"])
  return _cross_entropy(logits, batch)


def _argmax(out: Array, batch: Batch, task: TaskSettings) -> Array:
  del batch, task
  return jnp.argmax(out, -1)


def _as_is(out: Array, batch: Batch, task: TaskSettings) -> Array:
  del batch, task
  return out


def _best_spans(out: Array, batch: Batch, task: TaskSettings) -> Array:
  """(start, end, score) rows: the best span of each window."""
  spans = best_spans(out[..., 0], out[..., 1], batch["context_mask"],
                     task.max_answer_tokens)
  return jnp.stack(spans, -1).astype(jnp.float32)


def _metric_set(task: TaskSettings) -> str:
  """The task's own metrics, else (task=files) its kind's."""
  return task.metrics or task.kind


def _metrics(task: TaskSettings, preds, feats, examples):
  del examples
  return task_metrics.compute_metrics(_metric_set(task), preds, feats.arrays["labels"])


def _tag_metrics(task: TaskSettings, preds, feats, examples):
  """Only labelled (first sub-word) positions count."""
  del examples
  keep = feats.arrays["label_weights"] > 0
  return task_metrics.compute_metrics(
      _metric_set(task), [p[k] for p, k in zip(preds, keep)],
      [l[k] for l, k in zip(feats.arrays["labels"], keep)])


def _answer_metrics(task: TaskSettings, preds, feats, examples):
  """Answer texts (the best window per question) against the gold answers."""
  del task
  return task_metrics.squad_metrics(span_features.span_texts(examples, feats, preds),
                                    examples)


def _probabilities(out: Array, batch: Batch, task: TaskSettings) -> Array:
  """Softmax over the classes (text_to_text: over the label texts' likelihoods)."""
  del batch, task
  return jax.nn.softmax(out.astype(jnp.float32), -1)


def _labels(spec, probs, feats, examples):
  """The likeliest label's name and every label's probability."""
  del feats, examples
  names = spec.label_names
  out = []
  for p in np.asarray(probs, np.float64):
    best = int(np.argmax(p))
    row = {"label": names[best],
           "probabilities": {n: round(float(x), 6) for n, x in zip(names, p)}}
    if spec.label_words:  # text_to_text: what the decoder writes
      row["text"] = spec.label_words[best]
    out.append(row)
  return out


def _values(spec, scores, feats, examples):
  del spec, feats, examples
  return [{"value": float(v)} for v in scores]


def _tags(spec, tag_ids, feats, examples):
  """One tag per word (its first sub-word's); None for words cut by max_len."""
  out = []
  for ids, w, words in zip(tag_ids, feats.arrays["label_weights"], examples.words):
    tags = [spec.label_names[int(t)] for t in ids[w > 0]]
    out.append({"tags": tags + [None] * (len(words) - len(tags))})
  return out


def _answers(spec, spans, feats, examples):
  """The best span of any window, as context text."""
  del spec
  texts = span_features.span_texts(examples, feats, spans)
  return [{"answer": texts.get(ex.id, "")} for ex in examples]


REGISTRY: dict[str, TaskKind] = {k.name: k for k in (
    TaskKind("classification", _encode_sequences, _cross_entropy, _argmax, _metrics,
             _probabilities, _labels),
    TaskKind("regression", _encode_sequences, _squared_error, _as_is, _metrics,
             _as_is, _values),
    TaskKind("token_classification", _encode_tagging, _cross_entropy, _argmax,
             _tag_metrics, _argmax, _tags, counts="tags"),
    TaskKind("span_qa", _encode_spans, _span_boundaries, _best_spans, _answer_metrics,
             _best_spans, _answers, too_long="split into windows",
             counts="answer_boundaries"),
    TaskKind("text_to_text", _encode_sequences, _gold_text_likelihood, _argmax,
             _metrics, _probabilities, _labels),
    TaskKind(generation.KIND, generation.encode, None, _as_is, generation.score,
             _as_is, generation.present,
             make_loss=generation.make_loss, forward=generation.forward,
             weights="decoder_loss_weights", counts="tokens"),
)}


def get(name: str) -> TaskKind:
  """The task kind called ``name`` (config.task.kind)."""
  if name not in REGISTRY:
    raise ValueError(f"unknown task kind {name!r} (config.task.kind); known: "
                     f"{', '.join(REGISTRY)}")
  return REGISTRY[name]
