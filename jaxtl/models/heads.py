"""Task heads on top of a pretrained backbone, and the ELMo scalar mix.

A :class:`TaskModel` wraps the *same* module class that pretraining used,
under the name ``backbone``, so a pretraining checkpoint's parameters map
one-to-one into ``params["backbone"]`` (the LM head is simply never built);
the task head lives under ``params["head"]``.

Shape letters as in :mod:`jaxtl.models.layers`; C is the number of labels,
L the number of hidden-state layers.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtl.models import layers, paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.dropout import Dropout
from jaxtl.models.family import family_of
from jaxtl.models.transformer import build_model

Array = jax.Array

POOLINGS = ("first", "last", "mean", "concat", "pooler")
# The width of each linear head (None: num_labels); text_to_text and
# generation have none, their LM is the head. The task kinds themselves,
# with what each reads and reports, are jaxtl.tasks.kinds.REGISTRY.
HEAD_WIDTHS = {"classification": None, "regression": 1, "token_classification": None,
               "span_qa": 2}


def pool(hidden_BTD: Array, segment_ids_BT: Array, method: str) -> Array:
  """One vector per sequence from its tokens: those where ``segment_ids_BT``
  is above 0, one run of them per row (a row's text, or in a packed batch
  one example's span of its row: :func:`example_spans`).

  ``first``: the first token ([CLS], BERT); ``last``: the last one (causal
  models, where only it has seen the whole text); ``mean``:
  the average over non-padding tokens; ``concat``: ULMFiT's concat pooling
  (Howard & Ruder 2018), [last, max over non-padding tokens, mean] side by
  side ([B, 3D]), so the classifier sees the whole text's states, not just
  the last one's, which can lose what was said early in a long text.
  (``pooler``, BERT's dense + tanh over the first token, has parameters:
  :class:`ClassifierHead` owns it.)
  """
  mask_BT = segment_ids_BT > 0
  if method in ("first", "last"):
    at_B = pooled_position(mask_BT, method)
    return jnp.take_along_axis(hidden_BTD, at_B[:, None, None], axis=1)[:, 0]
  if method == "mean":
    w_BT = mask_BT.astype(hidden_BTD.dtype)
    return (hidden_BTD * w_BT[..., None]).sum(1) / jnp.maximum(w_BT.sum(1), 1)[:, None]
  if method == "concat":
    neg = jnp.finfo(hidden_BTD.dtype).min
    max_BD = jnp.where(mask_BT[..., None], hidden_BTD, neg).max(1)
    max_BD = jnp.where(mask_BT.any(-1, keepdims=True), max_BD, 0)  # all-padding rows
    return jnp.concatenate([pool(hidden_BTD, segment_ids_BT, "last"), max_BD,
                            pool(hidden_BTD, segment_ids_BT, "mean")], axis=-1)
  raise ValueError(f"unknown pooling {method!r}; expected one of {POOLINGS}")


def pool_method(pooling: str) -> str:
  """What :func:`pool` reads for a head's ``pooling``: ``pooler`` reads
  [CLS] (``first``) and then applies its dense + tanh."""
  return "first" if pooling == "pooler" else pooling


def pooled_position(mask_BT: Array, method: str) -> Array:
  """Where ``first`` or ``last`` pooling reads each row: its first or last
  token inside ``mask_BT`` (0 for a row with none) [B]."""
  if method == "first":
    return jnp.argmax(mask_BT, -1)
  t = mask_BT.shape[1]
  return jnp.where(mask_BT.any(-1), t - 1 - jnp.argmax(mask_BT[:, ::-1], -1), 0)


def example_spans(hidden_BTD: Array, spans: tuple[Array, Array, Array]
                  ) -> tuple[Array, Array]:
  """A packed batch's states per example (:mod:`jaxtl.tasks.packing`):
  [N, T, D], example n's row, and the mask of its span in that row [N, T],
  which :func:`pool` reads as segment ids."""
  rows_N, starts_N, ends_N = spans
  t_T = jnp.arange(hidden_BTD.shape[1])
  return hidden_BTD[rows_N], (t_T >= starts_N[:, None]) & (t_T < ends_N[:, None])


def default_pooling(family: str) -> str:
  """[CLS] for BERT-style encoders; the token mean for the others (why:
  :attr:`jaxtl.models.family.Family.default_pooling`)."""
  return family_of(family).default_pooling


class ScalarMix(nn.Module):
  """ELMo's learned softmax-weighted sum of all layers, times a scale gamma.

  ``normalize`` standardises each layer's states over the features first
  (ELMo's ``do_layer_norm``). Pre-LN stacks need it: their residual stream
  grows layer by layer, so without it the mix weights would mostly pick up
  the scale of the deepest layers rather than their content.
  """
  normalize: bool = True

  @nn.compact
  def __call__(self, hidden_states: Sequence[Array]) -> Array:
    stacked_LBTD = jnp.stack(hidden_states)
    if self.normalize:
      stacked_LBTD = nn.LayerNorm(use_bias=False, use_scale=False, epsilon=1e-6,
                                  dtype=stacked_LBTD.dtype)(stacked_LBTD)
    logits_L = self.param(paths.MIX_WEIGHTS, nn.initializers.zeros_init(),
                          (len(hidden_states),))
    gamma = self.param(paths.MIX_GAMMA, nn.initializers.ones_init(), ())
    w_L = jax.nn.softmax(logits_L).astype(stacked_LBTD.dtype)
    return gamma * jnp.einsum("l,lbtd->btd", w_L, stacked_LBTD)


def context_only(logits_BXT: Array, context_BT: Array) -> Array:
  """Logits over positions (last axis) with every non-context position ruled out."""
  neg = jnp.finfo(logits_BXT.dtype).min
  return jnp.where(context_BT[:, None, :] > 0, logits_BXT, neg)


def best_spans(start_BT: Array, end_BT: Array, context_BT: Array,
               max_answer_length: int) -> tuple[Array, Array, Array]:
  """Highest-scoring (start, end) with start <= end < start + max length,
  both inside the context (``context_BT`` > 0 on context tokens), and its
  score (start logit + end logit)."""
  t = start_BT.shape[1]
  neg = jnp.finfo(start_BT.dtype).min
  s_BT, e_BT = jnp.unstack(context_only(jnp.stack([start_BT, end_BT], 1), context_BT),
                           axis=1)
  offset = jnp.arange(t)[None, :] - jnp.arange(t)[:, None]  # end - start
  valid_TT = (offset >= 0) & (offset < max_answer_length)
  scores_BTT = s_BT[:, :, None] + e_BT[:, None, :]
  scores_BTT = jnp.where(valid_TT[None], scores_BTT, neg)
  flat_BN = scores_BTT.reshape(scores_BTT.shape[0], -1)
  flat_B = jnp.argmax(flat_BN, axis=-1)
  return flat_B // t, flat_B % t, jnp.max(flat_BN, axis=-1)


def label_log_likelihoods(backbone: nn.Module, enc_BSD: Array, enc_segment_ids_BS: Array,
                          targets_CL: Array, pad_id: int, start_id: int, *,
                          deterministic: bool = True) -> Array:
  """log p(label text c | input b) under an encoder-decoder's LM: [B, C].

  ``targets_CL`` holds each label's tokens (ending in EOS, padded with
  ``pad_id``); the decoder reads them shifted right behind ``start_id`` (T5's
  pad, BART's EOS: ``TransformerConfig.decoder_start_id``). Every (example,
  label) pair is decoded as one row.
  """
  b, c = enc_BSD.shape[0], targets_CL.shape[0]
  inputs_CL = jnp.concatenate(
      [jnp.full((c, 1), start_id, targets_CL.dtype), targets_CL[:, :-1]], axis=1)
  keep_CL = (targets_CL != pad_id).astype(jnp.int32)
  per_row = lambda x: jnp.repeat(x, c, axis=0)  # example b -> rows b*C .. b*C+C-1
  per_label = lambda x_CL: jnp.tile(x_CL, (b, 1))
  logits_NLV, _, _ = backbone.decode(per_row(enc_BSD), per_row(enc_segment_ids_BS),
                                     per_label(inputs_CL), per_label(keep_CL),
                                     deterministic=deterministic)
  logp_NLV = jax.nn.log_softmax(logits_NLV.astype(jnp.float32))
  logp_NL = jnp.take_along_axis(logp_NLV, per_label(targets_CL)[..., None], -1)[..., 0]
  return (logp_NL * per_label(keep_CL)).sum(-1).reshape(b, c)


# Task kinds whose head pools each example's states to one output: the ones a
# packed batch (several examples sharing a row) can feed.
POOLED_KINDS = ("classification", "regression")


class TaskModel(nn.Module):
  """Backbone (any family) + a task head.

  kind: classification (``num_labels`` classes), regression (one score),
  token_classification (one label per token), span_qa (start/end logits),
  text_to_text (T5: the decoder writes the label's name; the output is the
  log-likelihood of each of ``label_tokens``, so the prediction is the
  likeliest label, i.e. rank classification, and no new parameters exist),
  generation (T5 or GPT-2 writes free text with its LM; no head).
  For encoder-decoder backbones the encoder's states feed the other heads
  (T5 classification through the encoder). ``scalar_mix`` replaces the last
  hidden state with an ELMo mix of all layers. ``pooling="pooler"`` is
  BERT's: dense + tanh over the first token (imported BERT checkpoints
  carry its weights).
  """
  config: TransformerConfig
  kind: str = "classification"
  num_labels: int = 2
  pooling: str = "first"
  dropout_rate: float = 0.1
  scalar_mix: bool = False
  label_tokens: tuple[tuple[int, ...], ...] = ()  # text_to_text: [C, L], padded
  pad_id: int = 0
  eos_id: int | None = None  # with pad_id, picks the decoder's start token

  @property
  def decoder_start_id(self) -> int:
    return self.config.decoder_start_id(self.pad_id, self.eos_id)

  @nn.compact
  def __call__(self, tokens_BT: Array, segment_ids_BT: Array | None = None,
               positions_BT: Array | None = None,
               token_types_BT: Array | None = None, *,
               deterministic: bool = True,
               packed: tuple[Array, Array, Array] | None = None) -> Array:
    """The head's output; ``packed``: the rows are a packed batch's
    (:mod:`jaxtl.tasks.packing`), these each example's row, start and end,
    and the output is per example (classification and regression only)."""
    if segment_ids_BT is None:
      segment_ids_BT = jnp.ones_like(tokens_BT)
    if packed is not None and self.kind not in POOLED_KINDS:
      raise ValueError(f"packed rows feed classification and regression heads, "
                       f"not {self.kind!r}")
    backbone = build_model(self.config, name=paths.BACKBONE)
    flags = dict(deterministic=deterministic, return_hidden=self.scalar_mix)
    if self.kind == "generation":
      return self._next_token_logits(backbone, tokens_BT, segment_ids_BT, positions_BT,
                                     token_types_BT, deterministic)
    seq2seq = family_of(self.config).seq2seq
    if self.kind == "text_to_text" and not seq2seq:
      raise ValueError("text_to_text needs an encoder-decoder (T5) backbone; "
                       f"this one is {self.config.family!r}")
    if seq2seq:
      hidden_BTD, extras = backbone.encode(tokens_BT, segment_ids_BT,
                                           positions_BT, **flags)
      states = extras.get("hidden_states")
      if self.kind == "text_to_text":
        return label_log_likelihoods(backbone, hidden_BTD, segment_ids_BT,
                                     jnp.asarray(self.label_tokens, jnp.int32),
                                     self.pad_id, self.decoder_start_id,
                                     deterministic=deterministic)
    else:
      at = self._pooled_at(segment_ids_BT, packed)
      out = backbone(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                     lm_head=False, sentence_head=False, outputs_at=at, **flags)
      hidden_BTD, states = out["last_hidden"], out.get("hidden_states")
      if at is not None:  # [N, 1, D]: the pooled token of each example
        segment_ids_BT, packed = jnp.ones(hidden_BTD.shape[:2], jnp.int32), None
    if self.scalar_mix:
      hidden_BTD = ScalarMix(name=paths.SCALAR_MIX)(states)
    if packed is not None:
      hidden_BTD, segment_ids_BT = example_spans(hidden_BTD, packed)
    return ClassifierHead(self.config, self.kind, self.num_labels, self.pooling,
                          self.dropout_rate, name=paths.HEAD)(
                              hidden_BTD, segment_ids_BT,
                              deterministic=deterministic)


  def _pooled_at(self, segment_ids_BT: Array, packed: tuple[Array, Array, Array] | None
                 ) -> tuple[Array, Array] | None:
    """(rows, positions) of the one token per example that the head pools
    ([CLS] or the last), or None when it reads more: the backbone then runs
    its last layer at those tokens alone (:class:`Stack`'s ``outputs_at``)."""
    method = pool_method(self.pooling)
    if (self.kind not in POOLED_KINDS or method not in ("first", "last")
        or self.scalar_mix or self.config.scan_layers):
      return None
    if packed is None:
      return (jnp.arange(segment_ids_BT.shape[0]),
              pooled_position(segment_ids_BT > 0, method))
    rows_N, starts_N, ends_N = packed
    at_N = starts_N if method == "first" else ends_N - 1
    return rows_N, jnp.where(ends_N > starts_N, at_N, 0)  # as pool() reads an empty span

  def _next_token_logits(self, backbone: nn.Module, tokens_BT: Array,
                         segment_ids_BT: Array, positions_BT: Array | None,
                         token_types_BT: Array | None, deterministic: bool) -> Array:
    """generation: the LM is the whole model (no head). Its training and
    decoding apply the backbone directly (:mod:`jaxtl.tasks.generation`);
    this call builds every parameter and gives the first output token's
    logits [B, V] (T5: after the start token; GPT-2: after the input)."""
    family = family_of(self.config)
    family.check_generates("task kind generation")
    if family.seq2seq:
      enc_BTD = backbone.encode(tokens_BT, segment_ids_BT, positions_BT,
                                deterministic=deterministic)[0]
      start_B1 = jnp.full((tokens_BT.shape[0], 1), self.decoder_start_id, jnp.int32)
      return backbone.decode(enc_BTD, segment_ids_BT, start_B1,
                             deterministic=deterministic)[0][:, 0]
    logits_BTV = backbone(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                          deterministic=deterministic)["logits"]
    last_B = jnp.maximum((segment_ids_BT > 0).sum(-1) - 1, 0)
    return jnp.take_along_axis(logits_BTV, last_B[:, None, None], axis=1)[:, 0]


class ClassifierHead(nn.Module):
  """Dropout + a linear layer over pooled or per-token states."""
  config: TransformerConfig
  kind: str
  num_labels: int
  pooling: str = "first"
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, hidden_BTD: Array, segment_ids_BT: Array, *,
               deterministic: bool = True) -> Array:
    cfg = self.config
    if self.kind not in HEAD_WIDTHS:
      raise ValueError(f"no linear head for task kind {self.kind!r}; heads: "
                       f"{', '.join(HEAD_WIDTHS)}")
    outputs = HEAD_WIDTHS[self.kind] or self.num_labels
    x = hidden_BTD
    if self.kind in POOLED_KINDS:
      x = pool(x, segment_ids_BT, pool_method(self.pooling))
      if self.pooling == "pooler":
        x = jnp.tanh(layers.dense(cfg, cfg.d_model, ("embed", "mlp"), paths.POOLER,
                                  cfg.jnp_dtype)(x))
    x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
    logits = layers.dense(cfg, outputs, ("embed", "labels"), paths.HEAD_OUT,
                          jnp.float32)(x)
    if self.kind == "regression":
      return logits[..., 0]
    return logits  # [B, C], [B, T, C], or [B, T, 2] (start, end) for span_qa
