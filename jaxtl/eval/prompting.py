"""Zero- and few-shot classification by prompting a causal LM (GPT-2/GPT-3).

No parameter changes: each test input is written into a prompt after ``k``
labeled demonstrations from the training split, and the predicted class is
the one whose label words (verbalizer) the model finds likeliest as the
prompt's continuation (rank classification: the summed log-probability of
the label's tokens, so multi-token words are scored whole). One set of
demonstrations is drawn per seed and shared by every test input, as in
Zhao et al. (2021): the spread over seeds is the sensitivity to which
examples were shown.

Calibration (Zhao et al. 2021, "Calibrate Before Use"): the same prompt
with a content-free input ("N/A", "", "[MASK]") in place of the text gives
the label distribution the prompt alone induces, p_cf (normalised over the
labels, averaged over the content-free inputs); each test input's label
probabilities are divided by it (W = diag(p_cf)^-1, b = 0) before the
argmax. This undoes a prompt's preference for a label, e.g. the most
recent or most frequent one among the demonstrations.

A template holds ``{text}`` (and ``{text_pair}`` for pair tasks) and ends
with ``{label}``: demonstrations are the template filled in with their label
words, the query is the template cut before ``{label}``.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxtl.data.tokenizers import Tokenizer
from jaxtl.eval import scoring
from jaxtl.models import TransformerConfig
from jaxtl.tasks.examples import Examples

LABEL_FIELD = "{label}"


@dataclasses.dataclass(frozen=True)
class Prompt:
  """How a task is put to the model.

  Attributes:
    template: Text with ``{text}`` (``{text_pair}``) ending in ``{label}``.
    label_words: What the model should say for each class, by class id
      (one or several tokens each).
    separator: Between demonstrations, and before the query.
    content_free: Inputs that say nothing, for calibration.
  """
  template: str
  label_words: tuple[str, ...]
  separator: str = "\n\n"
  content_free: tuple[str, ...] = ("N/A", "", "[MASK]")

  def __post_init__(self):
    fields = {f for _, f, _, _ in string.Formatter().parse(self.template) if f}
    if not self.template.endswith(LABEL_FIELD) or self.template.count(LABEL_FIELD) != 1:
      raise ValueError(f"prompt template {self.template!r} must end with {LABEL_FIELD} "
                       "(the label words are scored as its continuation), once")
    unknown = fields - {"text", "text_pair", "label"}
    if unknown or "text" not in fields:
      raise ValueError(f"prompt template {self.template!r}: fields must be {{text}}, "
                       f"optionally {{text_pair}}, and {LABEL_FIELD}; got {sorted(fields)}")
    if len(set(self.label_words)) != len(self.label_words) or not all(self.label_words):
      raise ValueError(f"label words {self.label_words} must be distinct and non-empty")

  def fill(self, text: str, text_pair: str | None = None, label: str = "") -> str:
    """The template with its fields filled (an empty label leaves the query)."""
    return self.template.format(text=text, text_pair=text_pair or "", label=label)


# Default prompts of the built-in tasks, by config.task.name. The label words
# are single everyday words where the label names are codes (TREC's).
PROMPTS: dict[str, Prompt] = {
    "trec": Prompt("Question: {text}\nAnswer type: {label}",
                   ("abbreviation", "description", "entity", "person", "location",
                    "number")),
    "sst2": Prompt("Review: {text}\nSentiment: {label}", ("negative", "positive")),
    "imdb": Prompt("Review: {text}\nSentiment: {label}", ("negative", "positive")),
    "rte": Prompt("{text}\nQuestion: {text_pair} True or False?\nAnswer: {label}",
                  ("True", "False")),
    "mrpc": Prompt("{text}\nQuestion: does this mean \"{text_pair}\"? Yes or No?\n"
                   "Answer: {label}", ("No", "Yes")),
}


def default_prompt(task: str, label_names: Sequence[str] | None) -> Prompt:
  """The task's entry of :data:`PROMPTS`, else "{text}\\nLabel: {label}" with
  the label names (underscores as spaces) as words."""
  if task in PROMPTS:
    return PROMPTS[task]
  if not label_names:
    raise ValueError(f"task {task!r} has no label names: prompting classifies")
  return Prompt("{text}\nLabel: {label}", tuple(n.replace("_", " ") for n in label_names))


def demonstrations(train: Examples, shots: int, seed: int) -> list[int]:
  """``shots`` distinct training indices drawn by ``seed`` (in prompt order)."""
  if shots > len(train):
    raise ValueError(f"{shots} shots but only {len(train)} training examples")
  return [int(i) for i in np.random.default_rng(seed).choice(len(train), shots,
                                                             replace=False)]


def _pair(ex: Examples, i: int) -> str | None:
  return ex.text_pairs[i] if ex.text_pairs is not None else None


def demonstration_text(prompt: Prompt, train: Examples, indices: Sequence[int]) -> str:
  """The demonstrations, each followed by the separator (empty for zero-shot)."""
  return "".join(prompt.fill(train.texts[i], _pair(train, i),
                             prompt.label_words[train.labels[i]]) + prompt.separator
                 for i in indices)


def split_encode(tok: Tokenizer, context: str, continuation: str
                 ) -> tuple[list[int], list[int]]:
  """(context ids, continuation ids) as the whole text tokenizes.

  Spaces at the context's end go to the continuation (" positive" is one
  word piece; "Sentiment: " + "positive" would tokenize the space alone).
  When the whole text's ids start with the context's, the continuation is
  the rest; otherwise (a merge across the boundary) it is encoded alone.
  """
  stripped = context.rstrip()
  continuation = context[len(stripped):] + continuation
  ctx, whole = tok.encode(stripped), tok.encode(stripped + continuation)
  if whole[:len(ctx)] == ctx and len(whole) > len(ctx):
    return ctx, whole[len(ctx):]
  return ctx, tok.encode(continuation)


def label_requests(tok: Tokenizer, prompt: Prompt, prefix: str, inputs: Sequence[
    tuple[str, str | None]]) -> list[tuple[list[int], list[int]]]:
  """One (context, label words) pair per input and label, input-major."""
  pairs = []
  for text, text_pair in inputs:
    context = prefix + prompt.fill(text, text_pair)
    pairs += [split_encode(tok, context, word) for word in prompt.label_words]
  return pairs


def calibrate(scores_NY: np.ndarray, content_free_CY: np.ndarray) -> np.ndarray:
  """Calibrated label log-scores: log p(y|x) - log p_cf(y).

  ``content_free_CY`` holds each content-free input's label log-likelihoods;
  each row is normalised over the labels, and the probabilities averaged
  over the rows give p_cf. (Normalising p(y|x) too would shift each row by
  a constant and change no argmax.)
  """
  cf = np.exp(content_free_CY - content_free_CY.max(-1, keepdims=True))
  p_cf_Y = (cf / cf.sum(-1, keepdims=True)).mean(0)
  return scores_NY - np.log(p_cf_Y)


@dataclasses.dataclass
class Result:
  """One prompting run: a task, a number of shots, a seed.

  Attributes:
    accuracy: Rank classification.
    calibrated_accuracy: After calibration (None if not asked for).
    predictions, calibrated_predictions: Class ids per test input.
    scores: Each test input's label log-likelihoods (before calibration).
    demonstrations: The training indices shown.
    truncated: Share of scored rows whose prompt was cut on the left to fit.
    prompt_tokens: Mean context length in tokens (before any cut).
  """
  accuracy: float
  calibrated_accuracy: float | None
  predictions: list[int]
  calibrated_predictions: list[int] | None
  scores: list[list[float]]
  demonstrations: list[int]
  truncated: float
  prompt_tokens: float


def evaluate(config: TransformerConfig, params: Any, tok: Tokenizer, prompt: Prompt,
             train: Examples, test: Examples, *, shots: int, seed: int,
             calibrated: bool = True, batch_size: int = 32, max_len: int | None = None,
             progress: Any = None) -> Result:
  """Few-shot rank classification of ``test`` with ``shots`` demonstrations
  from ``train`` drawn by ``seed``."""
  if len(prompt.label_words) != len(test.label_names or ()):
    raise ValueError(f"{len(prompt.label_words)} label words {prompt.label_words} for "
                     f"{len(test.label_names or ())} classes {test.label_names}")
  shown = demonstrations(train, shots, seed)
  prefix = demonstration_text(prompt, train, shown)
  inputs = [(t, _pair(test, i)) for i, t in enumerate(test.texts)]
  free = [(c, c if test.text_pairs is not None else None) for c in prompt.content_free]
  pairs = label_requests(tok, prompt, prefix, inputs + (free if calibrated else []))
  max_len = min(max_len or config.max_len, config.max_len)
  logp, _ = scoring.loglikelihoods(config, params, pairs, batch_size=batch_size,
                                   max_len=max_len, pad_id=tok.pad_id, eos_id=tok.eos_id,
                                   progress=progress)
  y = len(prompt.label_words)
  scores_NY = logp.reshape(-1, y)
  test_NY, free_CY = scores_NY[:len(inputs)], scores_NY[len(inputs):]
  gold = np.asarray(test.labels)
  preds = test_NY.argmax(-1)
  cal = calibrate(test_NY, free_CY).argmax(-1) if calibrated else None
  lengths = np.array([len(c) + len(w) for c, w in pairs])
  return Result(
      accuracy=float((preds == gold).mean()),
      calibrated_accuracy=None if cal is None else float((cal == gold).mean()),
      predictions=preds.tolist(), calibrated_predictions=None if cal is None else cal.tolist(),
      scores=np.round(test_NY, 4).tolist(), demonstrations=shown, truncated=float((lengths > max_len + 1).mean()),
      prompt_tokens=float(np.mean([len(c) for c, _ in pairs])))
