"""Autoregressive generation with a KV cache, for decoder-only and
encoder-decoder models (``jaxtl generate`` is its command, in
:mod:`jaxtl.programs.generate`).

Greedy decoding, sampling (temperature, top-k, top-p), a repetition penalty,
several sequences per prompt, stopping at EOS or a token budget, and beam
search (encoder-decoders). The loop is one ``lax.while_loop`` over fixed
shapes inside ``jax.jit``: each step feeds one token per row through the
cached keys and values (``decode=True`` in :mod:`jaxtl.models.transformer`)
and never recomputes the prefix.

Shape letters: B rows, P prompt length, S encoder length, N new tokens,
V vocabulary, K beams.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtl.decoding import sampling
from jaxtl.models import TransformerConfig, build_model, family_of, paths
from jaxtl.models.transformer import apply_lm_head, lm_head_params

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
  """How to choose tokens.

  Attributes:
    max_new_tokens: Tokens generated per row (fewer only when all rows end).
    temperature: 0 picks the likeliest token (greedy); > 0 samples from
      softmax(logits / temperature).
    top_k: Sample only among the k likeliest tokens (0: all).
    top_p: Sample only from the smallest set of likeliest tokens whose
      probability reaches p (nucleus sampling; 1: all).
    repetition_penalty: > 1 discourages tokens already in the prompt or
      output (CTRL: positive logits divided by it, negative ones multiplied).
    num_return_sequences: Outputs per prompt.
    num_beams: > 1 runs beam search (encoder-decoders; greedy over beams).
    length_penalty: Beam scores are divided by length ** length_penalty.
    eos_id: A row stops after generating it (None: never).
    pad_id: Written after a row stops.
    vocab_size: Ids at or past it are never chosen (None: any row of the
      model's table). Pass the tokenizer's: a jaxtl model's table is padded
      to a multiple of 128 rows, and a barely trained model can pick a
      padding id, which no tokenizer decodes.
    suppress_ids: Ids never chosen (:func:`never_written`: a causal LM's
      special tokens, which no training target holds).
  """
  max_new_tokens: int = 32
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  repetition_penalty: float = 1.0
  num_return_sequences: int = 1
  num_beams: int = 1
  length_penalty: float = 1.0
  eos_id: int | None = None
  pad_id: int = 0
  vocab_size: int | None = None
  suppress_ids: tuple[int, ...] = ()


def never_written(tok: Any, family: str) -> tuple[int, ...]:
  """The ids a ``family`` model never learned to write, for
  ``GenerationConfig.suppress_ids``: a causal LM's special tokens other than
  end-of-text. Its pretraining and fine-tuning targets are text and EOS, so
  an undertrained one would otherwise print ``[MASK]`` or ``<extra_id_5>``
  (a jaxtl tokenizer reserves every objective's specials). An
  encoder-decoder keeps them: a span-pretrained T5 writes sentinels."""
  if not family_of(family).causal:
    return ()
  return tuple(int(i) for i in tok.special_ids if i != tok.eos_id)


def _tokenizer_ids_only(logits_BV: Array, gen: GenerationConfig) -> Array:
  """``logits_BV`` with the ids past ``gen.vocab_size``, and
  ``gen.suppress_ids``, made unchoosable."""
  width = logits_BV.shape[-1]
  if (gen.vocab_size is None or gen.vocab_size >= width) and not gen.suppress_ids:
    return logits_BV
  allowed_V = np.arange(width) < (gen.vocab_size or width)
  allowed_V[[i for i in gen.suppress_ids if i < width]] = False
  return jnp.where(allowed_V, logits_BV, jnp.finfo(logits_BV.dtype).min)


def process_logits(logits_BV: Array, seen_BV: Array, gen: GenerationConfig) -> Array:
  """Repetition penalty, temperature, top-k and top-p, as float32 logits
  over the tokenizer's ids."""
  logits_BV = _tokenizer_ids_only(logits_BV.astype(jnp.float32), gen)
  neg = jnp.finfo(jnp.float32).min
  if gen.repetition_penalty != 1.0:
    penalized = jnp.where(logits_BV > 0, logits_BV / gen.repetition_penalty,
                          logits_BV * gen.repetition_penalty)
    logits_BV = jnp.where(seen_BV, penalized, logits_BV)
  if gen.temperature > 0:
    logits_BV = logits_BV / gen.temperature
  if gen.top_k:
    kth_B1 = jax.lax.top_k(logits_BV, gen.top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth_B1, neg, logits_BV)
  if gen.top_p < 1.0:
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    # Keep a token while the mass of the likelier ones is below p (the first always).
    before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    cutoff_B1 = jnp.min(jnp.where(before_BV < gen.top_p, sorted_BV, jnp.inf), -1,
                        keepdims=True)
    logits_BV = jnp.where(logits_BV < cutoff_B1, neg, logits_BV)
  return logits_BV


def _choose(logits_BV: Array, rng: Array, gen: GenerationConfig) -> Array:
  if gen.temperature > 0:
    return sampling.sample(rng, logits_BV)  # one uniform per row, not one per entry
  return sampling.argmax(logits_BV)


def _empty_cache(model: nn.Module, *args: Any, method: Any = None) -> Any:
  """The zero "cache" collection for ``args``' shapes (no computation)."""
  shapes = jax.eval_shape(functools.partial(model.init, decode=True, method=method),
                          jax.random.key(0), *args)["cache"]
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _sample_loop(step, logits_BV: Array, cache: Any, seen_BV: Array, rng: Array,
                 gen: GenerationConfig) -> Array:
  """Chooses ``max_new_tokens`` tokens per row; ``step(cache, tokens_B, i)``
  feeds one token and returns (next logits, cache)."""
  b = logits_BV.shape[0]
  out_BN = jnp.full((b, gen.max_new_tokens), gen.pad_id, jnp.int32)

  def body(carry):
    i, out_BN, logits_BV, cache, done_B, seen_BV, rng = carry
    rng, key = jax.random.split(rng)
    tok_B = _choose(process_logits(logits_BV, seen_BV, gen), key, gen)
    tok_B = jnp.where(done_B, gen.pad_id, tok_B)
    out_BN = out_BN.at[:, i].set(tok_B)
    if gen.eos_id is not None:
      done_B = done_B | (tok_B == gen.eos_id)
    seen_BV = seen_BV.at[jnp.arange(b), tok_B].set(True)
    logits_BV, cache = step(cache, tok_B, i)
    return i + 1, out_BN, logits_BV, cache, done_B, seen_BV, rng

  def more(carry):
    i, done_B = carry[0], carry[4]
    return (i < gen.max_new_tokens) & ~jnp.all(done_B)

  carry = (jnp.array(0), out_BN, logits_BV, cache, jnp.zeros(b, bool), seen_BV, rng)
  return jax.lax.while_loop(more, body, carry)[1]


def _seen(tokens_BP: Array, mask_BP: Array, vocab: int) -> Array:
  seen_BV = jnp.zeros((tokens_BP.shape[0], vocab), bool)
  rows = jnp.broadcast_to(jnp.arange(tokens_BP.shape[0])[:, None], tokens_BP.shape)
  return seen_BV.at[rows, tokens_BP].max(mask_BP > 0)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _generate_decoder(cfg: TransformerConfig, gen: GenerationConfig, params: Any,
                      tokens_BP: Array, mask_BP: Array, rng: Array) -> Array:
  model = build_model(cfg)
  b, p = tokens_BP.shape
  cache = _empty_cache(model, jnp.zeros((b, p + gen.max_new_tokens), jnp.int32))
  # Left-padded prompts: each row's positions count its real tokens only.
  positions_BP = jnp.maximum(jnp.cumsum(mask_BP, -1) - 1, 0)
  # The prompt in one pass; logits of its last position only (every
  # position's would be B x P x V numbers, most of a long prompt's work).
  out, v = model.apply({"params": params, "cache": cache}, tokens_BP, mask_BP,
                       positions_BP, decode=True, lm_head=False, mutable=["cache"])
  first_BV = apply_lm_head(cfg, lm_head_params(cfg, params),
                           out["last_hidden"][:, -1:])[:, -1]
  next_pos_B = positions_BP[:, -1] + 1

  def step(cache, tok_B, i):
    out, v = model.apply({"params": params, "cache": cache}, tok_B[:, None],
                         jnp.ones((b, 1), jnp.int32), (next_pos_B + i)[:, None],
                         decode=True, mutable=["cache"])
    return out["logits"][:, -1], v["cache"]

  return _sample_loop(step, first_BV, v["cache"],
                      _seen(tokens_BP, mask_BP, cfg.vocab_size), rng, gen)


def _decoder_start(cfg: TransformerConfig, gen: GenerationConfig, params: Any,
                   tokens_BS: Array, mask_BS: Array) -> tuple[Any, Array, Any]:
  """(step, first logits, cache) of encoder-decoder decoding after the start
  token (T5's pad, or EOS for an imported BART: ``cfg.decoder_start``)."""
  model = build_model(cfg)
  b = tokens_BS.shape[0]
  enc_BSD = model.apply({"params": params}, tokens_BS, mask_BS, method=model.encode)[0]
  start_B1 = jnp.full((b, 1), cfg.decoder_start_id(gen.pad_id, gen.eos_id), jnp.int32)
  cache = _empty_cache(model, enc_BSD, mask_BS,
                       jnp.zeros((b, gen.max_new_tokens), jnp.int32), method=model.decode)
  (logits, _, _), v = model.apply({"params": params, "cache": cache}, enc_BSD, mask_BS,
                                  start_B1, decode=True, method=model.decode,
                                  mutable=["cache"])

  def step(cache, tok_B, i):
    del i
    (logits, _, _), v = model.apply({"params": params, "cache": cache}, None, mask_BS,
                                    tok_B[:, None], decode=True, method=model.decode,
                                    mutable=["cache"])
    return logits[:, -1], v["cache"]

  return step, logits[:, -1], v["cache"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _generate_encoder_decoder(cfg: TransformerConfig, gen: GenerationConfig, params: Any,
                              tokens_BS: Array, mask_BS: Array, rng: Array) -> Array:
  step, logits_BV, cache = _decoder_start(cfg, gen, params, tokens_BS, mask_BS)
  seen_BV = jnp.zeros((tokens_BS.shape[0], cfg.vocab_size), bool)
  return _sample_loop(step, logits_BV, cache, seen_BV, rng, gen)


def _gather_beams(cache: Any, rows: Array, scanned: bool) -> Any:
  """Reorders the cache's rows (axis 1 under scanned ``layers``, else 0)."""
  def take(path, x):
    if x.ndim == 0:
      return x
    in_scan = any(getattr(k, "key", None) == paths.LAYERS for k in path)
    axis = 1 if scanned and in_scan else 0
    return jnp.take(x, rows, axis=axis)
  return jax.tree_util.tree_map_with_path(take, cache)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _beam_search(cfg: TransformerConfig, gen: GenerationConfig, params: Any,
                 tokens_BS: Array, mask_BS: Array) -> Array:
  """Keeps the K likeliest prefixes per input; finished ones carry over as is.

  Returns the ``num_return_sequences`` best by score / length**length_penalty.
  """
  k, n = gen.num_beams, gen.max_new_tokens
  b = tokens_BS.shape[0]
  rep = lambda x: jnp.repeat(x, k, axis=0)  # row b*K + j is beam j of input b
  step, logits_RV, cache = _decoder_start(cfg, gen, params, rep(tokens_BS), rep(mask_BS))
  v = cfg.vocab_size
  neg = jnp.finfo(jnp.float32).min
  scores_BK = jnp.tile(jnp.array([0.0] + [neg] * (k - 1), jnp.float32), (b, 1))
  eos = -1 if gen.eos_id is None else gen.eos_id

  def body(carry):
    i, out_BKN, logits_RV, cache, done_BK, lengths_BK, scores_BK = carry
    logp_BKV = jax.nn.log_softmax(_tokenizer_ids_only(logits_RV.astype(jnp.float32), gen)
                                  ).reshape(b, k, v)
    # A finished beam can only be extended by padding, at no cost.
    pad_only_V = jnp.full((v,), neg).at[gen.pad_id].set(0.0)
    logp_BKV = jnp.where(done_BK[..., None], pad_only_V, logp_BKV)
    cand_BX = (scores_BK[..., None] + logp_BKV).reshape(b, k * v)
    scores_BK, idx_BK = jax.lax.top_k(cand_BX, k)
    beam_BK, tok_BK = idx_BK // v, (idx_BK % v).astype(jnp.int32)
    pick = lambda x: jnp.take_along_axis(x, beam_BK.reshape(b, k, *([1] * (x.ndim - 2))),
                                         axis=1)
    out_BKN = pick(out_BKN).at[:, :, i].set(tok_BK)
    was_done_BK = pick(done_BK)
    lengths_BK = pick(lengths_BK) + ~was_done_BK
    done_BK = was_done_BK | (tok_BK == eos)
    rows = (jnp.arange(b)[:, None] * k + beam_BK).reshape(-1)
    logits_RV, cache = step(_gather_beams(cache, rows, cfg.scan_layers),
                            tok_BK.reshape(-1), i)
    return i + 1, out_BKN, logits_RV, cache, done_BK, lengths_BK, scores_BK

  def more(carry):
    return (carry[0] < n) & ~jnp.all(carry[4])

  carry = (jnp.array(0), jnp.full((b, k, n), gen.pad_id, jnp.int32), logits_RV, cache,
           jnp.zeros((b, k), bool), jnp.zeros((b, k), jnp.int32), scores_BK)
  _, out_BKN, _, _, _, lengths_BK, scores_BK = jax.lax.while_loop(more, body, carry)
  final_BK = scores_BK / jnp.maximum(lengths_BK, 1) ** gen.length_penalty
  best_BR = jnp.argsort(-final_BK, axis=-1)[:, :gen.num_return_sequences]
  best = jnp.take_along_axis(out_BKN, best_BR[..., None], axis=1)
  return best.reshape(b * gen.num_return_sequences, n)


def generate(config: TransformerConfig, params: Any, tokens_BP: np.ndarray,
             mask_BP: np.ndarray | None = None, *, gen: GenerationConfig,
             rng: Array | None = None) -> np.ndarray:
  """New tokens [B * num_return_sequences, max_new_tokens], padded after EOS.

  Args:
    config: The model's config (decoder or encoder_decoder family).
    params: The model's parameters.
    tokens_BP: Prompts. Decoder-only: left-padded (the last column is each
      prompt's last token). Encoder-decoder: the encoder's input, padded
      anywhere (``mask_BP`` says where).
    mask_BP: 1 on real tokens (default: all).
    gen: Decoding settings.
    rng: For sampling (default: key 0).

  Returns:
    Rows ``b * num_return_sequences + j`` are output j of prompt b.
  """
  family = family_of(config)
  family.check_generates()
  if gen.num_beams > 1:
    family.check_beam_search()
  if gen.num_return_sequences > max(gen.num_beams, 1) and gen.num_beams > 1:
    raise ValueError(f"num_return_sequences={gen.num_return_sequences} exceeds "
                     f"num_beams={gen.num_beams}")
  if family.causal and tokens_BP.shape[1] + gen.max_new_tokens > config.max_len:
    raise ValueError(f"prompt ({tokens_BP.shape[1]}) + max_new_tokens "
                     f"({gen.max_new_tokens}) exceeds the model's max_len {config.max_len}")
  tokens = jnp.asarray(tokens_BP, jnp.int32)
  mask = jnp.ones_like(tokens) if mask_BP is None else jnp.asarray(mask_BP, jnp.int32)
  return np.asarray(generate_ids(config, gen, params, tokens, mask, rng))


def generate_ids(config: TransformerConfig, gen: GenerationConfig, params: Any,
                 tokens_BP: Array, mask_BP: Array, rng: Array | None = None) -> Array:
  """:func:`generate` without its checks and host arrays: traceable, so a
  jitted evaluation step (generative fine-tuning) can decode inside it."""
  cfg = config.replace(dropout_rate=0.0, attention_dropout_rate=0.0)
  tokens, mask = tokens_BP.astype(jnp.int32), mask_BP.astype(jnp.int32)
  rng = jax.random.key(0) if rng is None else rng
  if gen.num_beams > 1:
    return _beam_search(cfg, gen, params, tokens, mask)
  n = gen.num_return_sequences
  tokens, mask = jnp.repeat(tokens, n, axis=0), jnp.repeat(mask, n, axis=0)
  run = _generate_decoder if family_of(cfg).causal else _generate_encoder_decoder
  return run(cfg, gen, params, tokens, mask, rng)


def prompt_arrays(tok: Any, prompts: list[str], family: str
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Token and mask arrays: left-padded for decoders, EOS-terminated for T5.

  A decoder's empty prompt is its end-of-text token: pretraining put one
  after every document, so what follows it is a new document (GPT-2's own
  start token for unconditional text)."""
  eos = [tok.eos_id] if family_of(family).eos_ends_prompt else []
  rows = [(tok.encode(p) + eos) or [tok.eos_id] for p in prompts]
  width = max(map(len, rows))
  tokens = np.full((len(rows), width), tok.pad_id, np.int32)
  mask = np.zeros_like(tokens)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return tokens, mask
