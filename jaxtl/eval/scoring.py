"""Log-likelihoods of continuations given contexts, batched and jitted.

The one primitive under prompting (rank classification scores each label's
words after the prompt) and the lm-eval adapter (``loglikelihood`` and
``loglikelihood_rolling``): for each (context ids, continuation ids) pair,
the summed log-probability of the continuation and whether greedy decoding
would have produced it.

A decoder-only model reads ``context + continuation`` (cut on the left to
``max_len + 1`` tokens, so the newest context survives, as lm-eval does) and
scores the continuation's positions; an encoder-decoder reads the context
in the encoder and the continuation, teacher-forced after the start token,
in the decoder. Rows are right-padded, so positions count from each row's
first token and padding cannot change a score. Lengths are rounded up to a
few buckets (powers of two) and every batch has ``batch_size`` rows, so the
model compiles a handful of times, not once per example; the LM head runs at
the continuation's positions only, since a prompt's other positions are
never scored.

Shape letters: B rows, T tokens in, C continuation tokens, D width,
V vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxtl.decoding import sampling
from jaxtl.models import TransformerConfig, build_model, family_of
from jaxtl.models.transformer import apply_lm_head, lm_head_params

Pair = tuple[Sequence[int], Sequence[int]]  # (context ids, continuation ids)

MIN_BUCKET = 16


def bucket(n: int, limit: int) -> int:
  """``n`` rounded up to a power of two (at least :data:`MIN_BUCKET`), at most
  ``limit``: the few lengths batches are padded to."""
  size = MIN_BUCKET
  while size < n:
    size *= 2
  return max(min(size, limit), n)


def _decoder_row(context: Sequence[int], continuation: Sequence[int],
                 max_len: int) -> tuple[list[int], list[int], int]:
  """(inputs, continuation targets, index of the first target's input)."""
  seq = [*context, *continuation][-(max_len + 1):]
  inputs = seq[:-1]
  return inputs, list(continuation), len(inputs) - len(continuation)


def _check(pairs: Sequence[Pair], max_len: int, decoder: bool) -> None:
  for i, (context, continuation) in enumerate(pairs):
    if not continuation:
      raise ValueError(f"request {i}: empty continuation (nothing to score)")
    if decoder and not context:
      raise ValueError(f"request {i}: empty context; a decoder-only model needs "
                       "a token to predict the first one from (pass e.g. EOS)")
    if len(continuation) > max_len:
      raise ValueError(f"request {i}: continuation of {len(continuation)} tokens "
                       f"exceeds max_len {max_len}; score it in windows "
                       "(loglikelihood_rolling)")


def _batch_arrays(cfg: TransformerConfig, pairs: Sequence[Pair], rows: int,
                  max_len: int, pad_id: int, eos_id: int | None) -> dict[str, np.ndarray]:
  """The padded arrays of one batch (``rows`` rows; the missing ones repeat
  the first request, and their scores are thrown away)."""
  pairs = [*pairs, *[pairs[0]] * (rows - len(pairs))]
  c = bucket(max(len(cont) for _, cont in pairs), max_len)
  targets_BC = np.full((rows, c), pad_id, np.int32)
  weights_BC = np.zeros((rows, c), np.int32)
  for b, (_, cont) in enumerate(pairs):
    targets_BC[b, :len(cont)], weights_BC[b, :len(cont)] = cont, 1
  if family_of(cfg).seq2seq:
    contexts = [list(ctx)[-max_len:] for ctx, _ in pairs]
    s = bucket(max(map(len, contexts)), max_len)
    enc_BS, enc_seg_BS = _right_padded(contexts, s, pad_id)
    # Teacher forcing: the decoder reads its start token (T5's pad, BART's
    # EOS), then the targets.
    start = cfg.decoder_start_id(pad_id, eos_id)
    dec_BC = np.concatenate([np.full((rows, 1), start, np.int32), targets_BC[:, :-1]], 1)
    return {"encoder_input_tokens": enc_BS, "encoder_segment_ids": enc_seg_BS,
            "decoder_input_tokens": dec_BC, "decoder_segment_ids": np.ones_like(dec_BC),
            "target_index": np.broadcast_to(np.arange(c, dtype=np.int32), (rows, c)).copy(),
            "target_tokens": targets_BC, "target_weights": weights_BC}
  decoded = [_decoder_row(ctx, cont, max_len) for ctx, cont in pairs]
  t = bucket(max(len(inputs) for inputs, _, _ in decoded), max_len)
  tokens_BT, seg_BT = _right_padded([inputs for inputs, _, _ in decoded], t, pad_id)
  index_BC = np.zeros((rows, c), np.int32)
  for b, (_, cont, start) in enumerate(decoded):
    index_BC[b, :len(cont)] = start + np.arange(len(cont))
  return {"decoder_input_tokens": tokens_BT, "decoder_segment_ids": seg_BT,
          "target_index": index_BC, "target_tokens": targets_BC,
          "target_weights": weights_BC}


def _right_padded(rows: Sequence[Sequence[int]], width: int, pad_id: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  tokens = np.full((len(rows), width), pad_id, np.int32)
  segments = np.zeros_like(tokens)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], segments[i, :len(r)] = r, 1
  return tokens, segments


@functools.partial(jax.jit, static_argnums=0)
def _score_batch(cfg: TransformerConfig, params: Any, batch: dict[str, jax.Array]
                 ) -> tuple[jax.Array, jax.Array]:
  """(summed log-prob [B], greedy [B]) of each row's continuation."""
  model = build_model(cfg)
  if family_of(cfg).seq2seq:
    hidden_BTD = model.apply({"params": params}, batch["encoder_input_tokens"],
                             batch["decoder_input_tokens"], batch["encoder_segment_ids"],
                             batch["decoder_segment_ids"], lm_head=False)["last_hidden"]
  else:
    hidden_BTD = model.apply({"params": params}, batch["decoder_input_tokens"],
                             batch["decoder_segment_ids"], lm_head=False)["last_hidden"]
  hidden_BCD = jnp.take_along_axis(hidden_BTD, batch["target_index"][..., None], axis=1)
  logits_BCV = apply_lm_head(cfg, lm_head_params(cfg, params), hidden_BCD)
  logits_BCV = logits_BCV.astype(jnp.float32)
  targets_BC, real_BC = batch["target_tokens"], batch["target_weights"] > 0
  logp_BC = jnp.take_along_axis(jax.nn.log_softmax(logits_BCV), targets_BC[..., None],
                                axis=-1)[..., 0]
  greedy_BC = sampling.argmax(logits_BCV) == targets_BC
  # where, not a product: a padded position's -inf must not make 0 * -inf = nan.
  return (jnp.sum(jnp.where(real_BC, logp_BC, 0.0), -1),
          jnp.all(greedy_BC | ~real_BC, -1))


def loglikelihoods(config: TransformerConfig, params: Any, pairs: Sequence[Pair], *,
                   batch_size: int = 32, max_len: int | None = None, pad_id: int = 0,
                   eos_id: int | None = None, progress: Any = None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Summed log-probabilities [N] and greedy flags [N] of the continuations.

  Args:
    config: A decoder or encoder-decoder model's config.
    params: Its parameters, LM head included.
    pairs: (context ids, continuation ids) per request. A decoder-only
      model needs a non-empty context (a BOS or EOS token at least).
    batch_size: Rows per forward pass (every batch has this many).
    max_len: Tokens the model reads (default: ``config.max_len``). Use the
      length it was trained on when that is shorter: learned positions past
      it were never trained.
    pad_id: Written in padding (it is masked out).
    eos_id: The tokenizer's EOS, which an encoder-decoder whose decoder
      starts from it (``decoder_start='eos'``, BART) reads first.
    progress: Called with the number of requests done after each batch.

  Returns:
    In the order of ``pairs``.
  """
  family = family_of(config)
  family.check_generates()
  max_len = min(max_len or config.max_len, config.max_len)
  _check(pairs, max_len, family.causal)
  cfg = config.replace(dropout_rate=0.0, attention_dropout_rate=0.0)
  # Longest first, so a batch's rows share a bucket (and an error of memory
  # shows at once, not at the end).
  order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
  logp, greedy = np.zeros(len(pairs), np.float64), np.zeros(len(pairs), bool)
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    batch = _batch_arrays(cfg, [pairs[i] for i in idx], batch_size, max_len, pad_id,
                          eos_id)
    lp, gr = _score_batch(cfg, params, batch)
    logp[idx], greedy[idx] = np.asarray(lp)[:len(idx)], np.asarray(gr)[:len(idx)]
    if progress is not None:
      progress(len(idx))
  return logp, greedy
