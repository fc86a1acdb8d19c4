"""Generative fine-tuning: input text -> output text, written by the LM itself.

The task kind ``generation`` trains a T5 (encoder-decoder) or GPT-2
(decoder-only) backbone with teacher forcing and its own LM head, no new
parameters, and evaluates by decoding with :mod:`jaxtl.decoding.generate` (KV cache;
greedy, or beam search on T5) and scoring the texts
(:mod:`jaxtl.tasks.generation_metrics`: ROUGE, BLEU, exact match, F1).

Layouts (the pretraining feature names, so the loss is pretraining's own
chunked cross-entropy, :func:`jaxtl.objectives.make_loss_fn`):

  T5:      encoder  input </s>              decoder  <pad> output -> output </s>
           (BART imported from Hugging Face starts from </s>, not <pad>:
           ``TransformerConfig.decoder_start``)
  GPT-2:   decoder  input [SEP] output -> (shifted) output </s>, loss on
           the output and </s> only, never on the input

Several input fields become one text, T5 style: ``question: ... context: ...``.
Each example may have several references (SQuAD's annotators): the first is
the training target, all of them count in the scores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from jaxtl.decoding import generate as generate_lib
from jaxtl import objectives
from jaxtl.data import packing
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig, build_model, family_of, paths
from jaxtl.tasks import features as task_features
from jaxtl.tasks.config import TaskSettings
from jaxtl.tasks import generation_metrics
from jaxtl.tasks import metrics as task_metrics
from jaxtl.tasks.examples import Examples

KIND = "generation"
# What a task=files generation run reports, the first selecting checkpoints.
DEFAULT_METRICS = ("rougeL", "rouge1", "rouge2", "bleu", "exact_match", "f1")
PROMPT_TOKENS, PROMPT_MASK = "prompt_tokens", "prompt_mask"  # decoder-only, left-padded


@dataclasses.dataclass
class GenerationFeatures(task_features.Features):
  """Teacher-forcing arrays plus what turns generated ids back into scores.

  Attributes:
    references: Each example's reference texts (the first was trained on).
    ids: Each example's id (SQuAD's question ids), else its index.
    tokenizer: Decodes generated ids to text.
  """
  references: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
  ids: list[str] = dataclasses.field(default_factory=list)
  tokenizer: Tokenizer | None = None

  def texts(self, ids_BN: np.ndarray) -> list[str]:
    """Generated ids -> texts, each cut at its first EOS."""
    tok = self.tokenizer
    out = []
    for row in np.asarray(ids_BN):
      row = [int(t) for t in row]
      if tok.eos_id in row:
        row = row[:row.index(tok.eos_id)]
      out.append(tok.decode(row).strip())
    return out


def input_text(names: Sequence[str], values: Sequence[str]) -> str:
  """One field as it is; several as T5 writes them, ``name: value`` each."""
  if len(values) == 1:
    return values[0]
  return " ".join(f"{n}: {v}" for n, v in zip(names, values))


def sources(examples: Any, names: Sequence[str]
            ) -> tuple[list[str], list[tuple[str, ...]], list[str]]:
  """(input texts, references, ids) of file-task ``Examples`` (labels are
  reference tuples) or of SQuAD questions (``question: ... context: ...``
  -> every annotator's answer)."""
  if isinstance(examples, Examples):
    fields = ([examples.texts] if examples.text_pairs is None
              else [examples.texts, examples.text_pairs])
    texts = [input_text(names, values) for values in zip(*fields)]
    refs = [tuple(r) if isinstance(r, (list, tuple)) else (r,) for r in examples.labels]
    return texts, refs, [str(i) for i in range(len(texts))]
  names = names if len(names) == 2 else ("question", "context")
  return ([input_text(names, (ex.question, ex.context)) for ex in examples],
          [tuple(ex.answer_texts) for ex in examples], [ex.id for ex in examples])


def check_lengths(max_len: int, max_target_len: int, family: str) -> None:
  """Fails early, naming the keys, when the lengths leave no room."""
  if max_target_len < 1:
    raise ValueError(f"config.task.max_target_len={max_target_len}: must be >= 1 "
                     "(the output's tokens and </s>)")
  rules = family_of(family)
  rules.check_generates("task kind generation")
  if rules.causal and max_len < max_target_len + 2:
    raise ValueError(f"config.task.max_len={max_len} must exceed max_target_len="
                     f"{max_target_len} + 1: a decoder-only model holds the input, "
                     "the separator and the output in max_len tokens")


def encode(examples: Any, tok: Tokenizer, task: TaskSettings, model: TransformerConfig
           ) -> GenerationFeatures:
  """Teacher-forcing features for ``model``'s family (see the module's layouts)."""
  family = model.family
  check_lengths(task.max_len, task.max_target_len, family)
  texts, refs, ids = sources(examples, task.text_fields)
  inputs, targets = tok.encode_batch(texts), tok.encode_batch([r[0] for r in refs])
  n, t_out = len(texts), task.max_target_len
  if family_of(family).seq2seq:
    start = model.decoder_start_id(tok.pad_id, tok.eos_id)
    arrays, truncated = _encode_t5(inputs, targets, tok, task.max_len, t_out, start)
  else:
    arrays, truncated = _encode_decoder(inputs, targets, tok, task.max_len, t_out)
  arrays["labels"] = np.arange(n, dtype=np.int32)  # row -> example
  arrays["label_weights"] = np.ones(n, np.float32)
  return GenerationFeatures(arrays, truncated, refs, ids, tok)


def _target(ids: list[int], tok: Tokenizer, max_target_len: int) -> list[int]:
  return ids[:max_target_len - 1] + [tok.eos_id]


def _rows(seqs: list[list[int]], width: int, pad_id: int) -> np.ndarray:
  out = np.full((len(seqs), width), pad_id, np.int32)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s
  return out


def _side(prefix: str, tokens: np.ndarray, lengths: list[int]) -> dict[str, np.ndarray]:
  """One stack's input arrays: tokens, segment ids (1 on the first
  ``lengths`` tokens of each row) and positions."""
  segment = (np.arange(tokens.shape[1])[None] < np.asarray(lengths)[:, None])
  return {f"{prefix}_input_tokens": tokens,
          f"{prefix}_segment_ids": segment.astype(np.int32),
          f"{prefix}_positions": packing.row_positions(tokens.shape)}


def _encode_t5(inputs, targets, tok, max_len, max_target_len, start_id):
  enc = [x[:max_len - 1] + [tok.eos_id] for x in inputs]
  tgt = [_target(y, tok, max_target_len) for y in targets]
  truncated = sum(len(x) > max_len - 1 or len(y) > max_target_len - 1
                  for x, y in zip(inputs, targets))
  arrays = _side("encoder", _rows(enc, max_len, tok.pad_id), list(map(len, enc)))
  # The decoder reads the target shifted right behind its start token.
  arrays.update(_side("decoder", _rows([[start_id] + y[:-1] for y in tgt],
                                       max_target_len, tok.pad_id), list(map(len, tgt))))
  arrays["decoder_target_tokens"] = _rows(tgt, max_target_len, tok.pad_id)
  arrays["decoder_loss_weights"] = arrays["decoder_segment_ids"].astype(np.float32)
  return arrays, truncated


def _encode_decoder(inputs, targets, tok, max_len, max_target_len):
  _, sep, _ = task_features.frame(tok, "decoder")
  budget = max_len - max_target_len  # the prompt: input + separator
  prompts = [x[:budget - len(sep)] + sep for x in inputs]
  tgt = [_target(y, tok, max_target_len) for y in targets]
  truncated = sum(len(x) > budget - len(sep) or len(y) > max_target_len - 1
                  for x, y in zip(inputs, targets))
  seqs = [p + y for p, y in zip(prompts, tgt)]
  arrays = _side("decoder", _rows([s[:-1] for s in seqs], max_len, tok.pad_id),
                 [len(s) - 1 for s in seqs])
  arrays["decoder_token_type_ids"] = np.zeros_like(arrays["decoder_input_tokens"])
  arrays["decoder_target_tokens"] = _rows([s[1:] for s in seqs], max_len, tok.pad_id)
  # Position j predicts token j + 1: only the output's tokens (and </s>) count.
  arrays["decoder_loss_weights"] = _rows(
      [[0] * (len(p) - 1) + [1] * len(y) for p, y in zip(prompts, tgt)],
      max_len, 0).astype(np.float32)
  # Generation reads the prompt left-padded: the last column is its last token.
  left = np.full((len(seqs), budget), tok.pad_id, np.int32)
  mask = np.zeros_like(left)
  for i, p in enumerate(prompts):
    left[i, budget - len(p):], mask[i, budget - len(p):] = p, 1
  arrays[PROMPT_TOKENS], arrays[PROMPT_MASK] = left, mask
  return arrays, truncated


def make_loss(model: Any) -> Callable:
  """The LM's teacher-forced loss on ``params["backbone"]``: pretraining's
  own loss function, so the logits never exist whole."""
  lm_loss = objectives.make_loss_fn(build_model(model.config))

  def loss_fn(params, batch, rng, normalizer=None):
    return lm_loss(params[paths.BACKBONE], batch, rng, normalizer)

  return loss_fn


def generation_config(task: TaskSettings, tok: Tokenizer, family: str
                      ) -> generate_lib.GenerationConfig:
  """Greedy (or ``task.num_beams`` beams) up to ``task.max_target_len``
  tokens, none of them a special token a ``family`` model never wrote."""
  return generate_lib.GenerationConfig(
      max_new_tokens=task.max_target_len, num_beams=task.num_beams,
      num_return_sequences=1, eos_id=tok.eos_id, pad_id=tok.pad_id,
      vocab_size=tok.vocab_size, suppress_ids=generate_lib.never_written(tok, family))


def forward(model: Any, task: TaskSettings, tok: Tokenizer) -> Callable:
  """``(params, batch) -> generated ids [B, max_target_len]`` (traceable)."""
  cfg = model.config
  gen = generation_config(task, tok, cfg.family)
  keys = (("encoder_input_tokens", "encoder_segment_ids") if family_of(cfg).seq2seq
          else (PROMPT_TOKENS, PROMPT_MASK))

  def run(params, batch):
    return generate_lib.generate_ids(cfg, gen, params[paths.BACKBONE], batch[keys[0]],
                                     batch[keys[1]])

  return run


def metric_names(task: TaskSettings) -> tuple[str, ...]:
  """``task.metrics``: a task's set (squad: exact_match, f1), a comma list
  of :data:`generation_metrics.METRICS`, or "" for :data:`DEFAULT_METRICS`."""
  if not task.metrics:
    return DEFAULT_METRICS
  if task.metrics in task_metrics.TASK_METRICS:
    return task_metrics.TASK_METRICS[task.metrics]
  return tuple(n.strip() for n in task.metrics.split(",") if n.strip())


def score(task: TaskSettings, ids_BN: np.ndarray, feats: GenerationFeatures, examples: Any
          ) -> dict[str, float]:
  del examples
  return generation_metrics.generation_metrics(metric_names(task), feats.texts(ids_BN),
                                               feats.references)


def present(spec: Any, ids_BN: np.ndarray, feats: GenerationFeatures, examples: Any
            ) -> list[dict[str, Any]]:
  del spec, examples
  return [{"generated": text} for text in feats.texts(ids_BN)]


def unlabelled(spec: Any, rows: Sequence[Sequence[str]]) -> Examples:
  """Inputs to predict, with empty references (never read)."""
  return Examples(texts=[r[0] for r in rows], labels=[("",)] * len(rows),
                  text_pairs=[r[1] for r in rows] if len(spec.text_fields) == 2 else None)

