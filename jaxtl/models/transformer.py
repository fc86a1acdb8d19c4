"""Transformer stacks: encoder (BERT), decoder-only (GPT-2), encoder-decoder (T5).

All three are pure-functional Linen modules built from the same block. A model
returns a dict with ``logits`` and, on request, every layer's hidden states
and attention weights (for probing and ELMo-style scalar mixing).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtl.models import attention, layers, masks, paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.dropout import Dropout
from jaxtl.models.family import family_of

Array = jax.Array

_REMAT_POLICY = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def at_positions(a: Array, at: tuple[Array, Array], axis: int = 1) -> Array:
  """``a``'s entries at ``at`` = (rows [N], positions [N]) along ``axis``
  (the query axis), kept as an axis of length 1: [B, T, D] -> [N, 1, D],
  a mask [B, 1, T, S] -> [N, 1, 1, S]."""
  rows_N, t_N = at
  if a.shape[0] == 1:  # one array for every row (a shared position bias)
    rows_N = jnp.zeros_like(rows_N)
  return jnp.expand_dims(jnp.moveaxis(a, axis, 1)[rows_N, t_N], axis)


class TransformerBlock(nn.Module):
  """Self-attention (+ cross-attention) + MLP, each with a residual.

  Pre-norm (GPT-2, T5): x + f(norm(x)). Post-norm (BERT): norm(x + f(x)).
  The call signature ``(x, *broadcast) -> (x, per_layer_outputs)`` is what
  ``nn.scan`` needs, so the same block runs looped or scanned.
  """
  config: TransformerConfig
  cross_attention: bool = False
  deterministic: bool = True
  return_hidden: bool = False
  return_attention: bool = False
  decode: bool = False
  causal: bool = False  # decoder self-attention (a hint for the fused kernel)

  def _sublayer(self, x_BTD: Array, name: str, fn,
                at: tuple[Array, Array] | None = None) -> tuple[Array, Any]:
    """x + f(x) with the block's norm, dropout and adapter around f. With
    ``at``, ``fn`` reads the whole rows and answers at those positions
    only, and so does the residual: [N, 1, D]."""
    cfg = self.config
    drop = Dropout(cfg.dropout_rate, name=f"{name}_dropout")
    adapt = (layers.Adapter(cfg, name=paths.adapter(name)) if cfg.adapter_dim
             and name != paths.CROSS_ATTENTION else (lambda y: y))
    norm = layers.make_norm(cfg, paths.norm(name), residual=cfg.pre_norm)
    if cfg.pre_norm:
      h_BTD, x_BTD = norm(x_BTD)
      y_BTD, aux = fn(h_BTD)
    else:
      y_BTD, aux = fn(x_BTD)
    if at is not None:
      x_BTD = at_positions(x_BTD, at)
    x_BTD = x_BTD + drop(adapt(y_BTD), deterministic=self.deterministic)
    return (x_BTD if cfg.pre_norm else norm(x_BTD)), aux

  @nn.compact
  def __call__(self, x_BTD: Array, mask_B1TT: Array, bias_BHTT: Array | None,
               enc_BSD: Array | None = None, enc_mask_B1TS: Array | None = None,
               cache_index: Array | None = None, at: tuple[Array, Array] | None = None):
    """``at`` = (rows [N], positions [N]): only the states there are wanted,
    so the block answers [N, 1, D]: its queries, MLP and norms run at those
    positions alone, its keys and values over the whole rows."""
    cfg = self.config
    attn = functools.partial(attention.MultiHeadAttention, cfg,
                             deterministic=self.deterministic,
                             return_weights=self.return_attention, decode=self.decode)
    # A lone query per row: the fused kernel's causal mask would be the
    # wrong one; the explicit mask's row is the right one.
    self_attn = attn(name=paths.SELF_ATTENTION, causal=self.causal and at is None)
    if at is None:
      attend = lambda h: self_attn(h, h, mask_B1TT, bias_BHTT, cache_index)
    else:
      if self.cross_attention or self.decode:
        raise ValueError("states at chosen positions come from an encoder or "
                         "decoder-only stack run on whole rows")
      picked = lambda a, axis=2: None if a is None else at_positions(a, at, axis)
      attend = lambda h: self_attn(at_positions(h, at), h, picked(mask_B1TT),
                                   picked(bias_BHTT), kv_rows=at[0])
    x_BTD, self_w = self._sublayer(x_BTD, paths.SELF_ATTENTION, attend, at)
    cross_w = None
    if self.cross_attention:
      cross = attn(name=paths.CROSS_ATTENTION, cross=True)
      x_BTD, cross_w = self._sublayer(
          x_BTD, paths.CROSS_ATTENTION, lambda h: cross(h, enc_BSD, enc_mask_B1TS))
    mlp = layers.Mlp(cfg, name=paths.MLP)
    x_BTD, _ = self._sublayer(x_BTD, paths.MLP, lambda h: (mlp(h), None))
    if at is None:  # N picked states need not split over the mesh's batch axis
      x_BTD = layers.constrain(x_BTD, layers.ACT_BLD)
    outputs = {}
    if self.return_hidden:
      outputs["hidden"] = x_BTD
    if self.return_attention:
      outputs["attention"] = self_w
      if self.cross_attention:
        outputs["cross_attention"] = cross_w
    return x_BTD, outputs


class Stack(nn.Module):
  """Embeddings -> N blocks -> final norm (pre-norm models).

  Returns ``(last_hidden_BTD, extras)`` where extras holds, when asked,
  ``hidden_states`` (embedding output plus every layer, the last one after
  the final norm, as in Hugging Face) and per-layer ``attentions``.

  ``decode=True`` runs one step of autoregressive decoding against the
  "cache" collection: the init call's token shape [B, L] sizes the cache;
  each later call appends its T tokens at the cache index and attends to
  every filled slot up to its own (``segment_ids`` 0 marks padding slots,
  e.g. left-padded prompts). ``positions`` then default to the slot index.

  ``outputs_at`` = (rows [N], positions [N]): the caller reads the last
  layer's states at these positions only (a classifier's [CLS] tokens), so
  that layer computes them alone and the stack returns [N, 1, D]. The last
  layer's queries, MLP and norms then cost N tokens instead of B x T:
  nearly one layer's share of the step, for the same states.
  """
  config: TransformerConfig
  num_layers: int
  causal: bool
  token_embed: nn.Module
  cross_attention: bool = False

  def _decode_slots(self, segment_ids_BT: Array) -> tuple[Array, Array, Array]:
    """(cache index before this call, slot ids [B, L], slot segment ids [B, L]).

    Appends this call's segment ids to the cached ones and advances the index.
    """
    seg = self.variable("cache", "segment_ids", jnp.zeros, segment_ids_BT.shape, jnp.int32)
    index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
    if self.is_initializing():
      at = jnp.array(0, jnp.int32)
    else:
      at = index.value
      seg.value = jax.lax.dynamic_update_slice(
          seg.value, segment_ids_BT.astype(jnp.int32), (0, at))
      index.value = at + segment_ids_BT.shape[1]
    slots_BS = jnp.broadcast_to(jnp.arange(seg.value.shape[1]), seg.value.shape)
    return at, slots_BS, seg.value if not self.is_initializing() else segment_ids_BT

  @nn.compact
  def __call__(self, tokens_BT: Array, segment_ids_BT: Array | None = None,
               positions_BT: Array | None = None,
               token_types_BT: Array | None = None,
               enc_BSD: Array | None = None,
               enc_segment_ids_BS: Array | None = None, *,
               deterministic: bool = True, return_hidden: bool = False,
               return_attention: bool = False, decode: bool = False,
               prefix_BT: Array | None = None,
               outputs_at: tuple[Array, Array] | None = None):
    cfg = self.config
    if segment_ids_BT is None:
      segment_ids_BT = jnp.ones_like(tokens_BT)
    if outputs_at is not None and (cfg.scan_layers or return_hidden or return_attention):
      raise ValueError("outputs_at needs layers run one by one (not scan_layers) "
                       "and no per-layer states or attention weights")
    cache_index = None
    if prefix_BT is not None and (decode or not self.causal):
      raise ValueError("a bidirectional prefix (decoder_causal_attention) needs a "
                       "causal stack run on whole rows, not cached decoding")
    if decode:
      cache_index, slots_BS, kv_segment_ids_BS = self._decode_slots(segment_ids_BT)
      q_slots_BT = cache_index + jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]),
                                                  tokens_BT.shape)
      positions_BT = q_slots_BT if positions_BT is None else positions_BT
      mask_B1TT = (((kv_segment_ids_BS > 0)[:, None, :]
                    & (slots_BS[:, None, :] <= q_slots_BT[:, :, None]))[:, None])
      kv_positions_BS = slots_BS
    else:
      counted_from_0 = positions_BT is None  # every row: 0, 1, 2, ...
      if counted_from_0:
        positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]),
                                        tokens_BT.shape)
      mask_B1TT = masks.attention_mask(segment_ids_BT, segment_ids_BT,
                                        self.causal, positions_BT, positions_BT,
                                        prefix_BT)
      kv_positions_BS = positions_BT
    x_BTD = layers.Embedder(cfg, self.token_embed, deterministic,
                            name=paths.EMBEDDER)(tokens_BT, positions_BT,
                                             token_types_BT)
    embedded_BTD = x_BTD
    bias_BHTT = None
    if cfg.position == "relative":
      q_positions_BT = positions_BT if not decode else q_slots_BT
      if not decode and counted_from_0 and jax.default_backend() != "cpu":
        # Rows whose positions all count from 0 share one bias, [1, H, T, T]:
        # on a GPU, B copies of it were T5-small's biggest tensor (128 x 8 x
        # 512 x 512). On a CPU the batch's sum of the bias gradient costs
        # more than the copies: T5-small's float32 step at 32 x 512 took
        # 41.1 s that way against 37.0 (Zen 3; docs: studies/performance).
        q_positions_BT, kv_positions_BS = q_positions_BT[:1], kv_positions_BS[:1]
      bias_BHTT = masks.RelativePositionBias(
          cfg, bidirectional=not self.causal, name=paths.RELATIVE_BIAS)(
              q_positions_BT, kv_positions_BS)
    enc_mask_B1TS = None
    if self.cross_attention:
      enc_mask_B1TS = masks.attention_mask(segment_ids_BT, enc_segment_ids_BS)

    block = TransformerBlock
    if cfg.remat != "none":
      block = nn.remat(block, policy=_REMAT_POLICY[cfg.remat],
                       prevent_cse=not cfg.scan_layers)
    kwargs = dict(config=cfg, cross_attention=self.cross_attention,
                  deterministic=deterministic,
                  return_hidden=return_hidden,
                  return_attention=return_attention, decode=decode,
                  # The fused kernel's causal mask would hide a prefix's
                  # later tokens: with a prefix only the explicit mask counts.
                  causal=self.causal and prefix_BT is None)
    args = (mask_B1TT, bias_BHTT, enc_BSD, enc_mask_B1TS, cache_index)
    if cfg.scan_layers:
      scanned = nn.scan(block, variable_axes={"params": 0, "cache": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast,) * len(args),
                        length=self.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x_BTD, per_layer = scanned(**kwargs, name=paths.LAYERS)(x_BTD, *args)
      # Stacked [L, ...] outputs -> one entry per layer.
      per_layer = [jax.tree.map(lambda a, i=i: a[i], per_layer)
                   for i in range(self.num_layers)] if per_layer else []
    else:
      outs = []
      for i in range(self.num_layers):
        last = outputs_at if i == self.num_layers - 1 else None
        x_BTD, out = block(**kwargs, name=paths.layer(i))(x_BTD, *args, last)
        outs.append(out)
      per_layer = outs if any(outs) else []

    if cfg.pre_norm:
      x_BTD = layers.make_norm(cfg, paths.FINAL_NORM)(x_BTD)
      x_BTD = Dropout(cfg.dropout_rate)(x_BTD, deterministic=deterministic)
    extras = {}
    if return_hidden:
      hidden = [p["hidden"] for p in per_layer]
      extras["hidden_states"] = (embedded_BTD, *hidden[:-1], x_BTD)
    if return_attention:
      extras["attentions"] = tuple(p["attention"] for p in per_layer)
      if self.cross_attention:
        extras["cross_attentions"] = tuple(p["cross_attention"] for p in per_layer)
    return x_BTD, extras


class SentenceHead(nn.Module):
  """BERT's next-sentence (ALBERT's sentence-order) head: the pooler (dense +
  tanh over the first token, [CLS]) and a linear classifier over it.

  It lives in the backbone beside the LM head, not in a task head, because
  it is pretrained with it and Hugging Face's ``BertForPreTraining`` keeps
  both (``bert.pooler``, ``cls.seq_relationship``).
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, hidden_BTD: Array) -> Array:
    cfg = self.config
    dense = functools.partial(layers.dense, cfg)
    pooled_BD = jnp.tanh(dense(cfg.d_model, ("embed", "mlp"), paths.POOLER,
                               cfg.jnp_dtype)(hidden_BTD[:, 0]))
    return dense(cfg.sentence_classes, ("mlp", "labels"), paths.HEAD_OUT,
                 jnp.float32)(pooled_BD)  # [B, C]


class EncoderOrDecoder(nn.Module):
  """One stack + LM head: ``encoder`` (bidirectional, MLM) or ``decoder`` (causal LM).

  BERT and GPT-2 differ only in the attention mask and config switches
  (post- vs pre-norm, embedding norm, token types), so one module serves both.
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens_BT: Array, segment_ids_BT: Array | None = None,
               positions_BT: Array | None = None,
               token_types_BT: Array | None = None, *,
               deterministic: bool = True, return_hidden: bool = False,
               return_attention: bool = False, lm_head: bool = True,
               sentence_head: bool = True, decode: bool = False,
               prefix_BT: Array | None = None,
               outputs_at: tuple[Array, Array] | None = None) -> dict[str, Any]:
    """Runs the stack and (``lm_head``) the LM head.

    Training leaves the head out and applies it itself through
    :func:`apply_lm_head`: at the masked positions only (MLM), a chunk of
    positions at a time (:func:`jaxtl.objectives.chunked_cross_entropy`).
    ``prefix_BT`` (a decoder's prefix LM) marks the bidirectional prefix;
    ``outputs_at`` asks for the states at those (row, position) pairs only
    (:class:`Stack`).
    With ``config.sentence_classes`` and ``sentence_head`` (task models say
    False: they have heads of their own), ``sentence_logits`` [B, C] too.
    """
    cfg = self.config
    embed = layers.token_embedding(cfg)
    hidden_BTD, extras = Stack(
        cfg, cfg.num_layers, causal=family_of(cfg).causal, token_embed=embed,
        name=paths.STACK)(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                      deterministic=deterministic, return_hidden=return_hidden,
                      return_attention=return_attention, decode=decode,
                      prefix_BT=prefix_BT, outputs_at=outputs_at)
    out = {"last_hidden": hidden_BTD, **extras}
    if lm_head:
      out["logits"] = layers.LMHead(cfg, embed, name=paths.LM_HEAD)(hidden_BTD)
    if cfg.sentence_classes and sentence_head and not decode:
      out["sentence_logits"] = SentenceHead(cfg, name=paths.SENTENCE_HEAD)(hidden_BTD)
    return out


class EncoderDecoder(nn.Module):
  """T5: bidirectional encoder, causal decoder with cross-attention, shared table."""
  config: TransformerConfig

  def setup(self):
    # The attribute names are the parameter names: paths.TOKEN_EMBED,
    # paths.ENCODER, paths.DECODER and paths.LM_HEAD.
    cfg = self.config
    self.token_embed = layers.token_embedding(cfg)
    self.encoder = Stack(cfg, cfg.num_layers, causal=False,
                         token_embed=self.token_embed)
    self.decoder = Stack(cfg, cfg.decoder_layers, causal=True,
                         token_embed=self.token_embed, cross_attention=True)
    self.lm_head = layers.LMHead(cfg, self.token_embed)

  def encode(self, tokens_BS: Array, segment_ids_BS: Array | None = None,
             positions_BS: Array | None = None, *, deterministic: bool = True,
             return_hidden: bool = False, return_attention: bool = False):
    return self.encoder(tokens_BS, segment_ids_BS, positions_BS,
                        deterministic=deterministic,
                        return_hidden=return_hidden,
                        return_attention=return_attention)

  def decode(self, enc_BSD: Array | None, enc_segment_ids_BS: Array | None,
             tokens_BT: Array, segment_ids_BT: Array | None = None,
             positions_BT: Array | None = None, *, deterministic: bool = True,
             return_hidden: bool = False, return_attention: bool = False,
             decode: bool = False, lm_head: bool = True):
    """(logits or None without ``lm_head``, last hidden, extras) of the decoder.

    With ``decode`` (cached steps), ``enc_BSD`` is needed only on the first
    call; later ones pass None and reuse its keys/values."""
    if enc_segment_ids_BS is None:
      enc_segment_ids_BS = jnp.ones(enc_BSD.shape[:2], jnp.int32)
    hidden_BTD, extras = self.decoder(
        tokens_BT, segment_ids_BT, positions_BT, None, enc_BSD,
        enc_segment_ids_BS, deterministic=deterministic,
        return_hidden=return_hidden, return_attention=return_attention, decode=decode)
    return (self.lm_head(hidden_BTD) if lm_head else None), hidden_BTD, extras

  def __call__(self, encoder_tokens_BS: Array, decoder_tokens_BT: Array,
               encoder_segment_ids_BS: Array | None = None,
               decoder_segment_ids_BT: Array | None = None,
               encoder_positions_BS: Array | None = None,
               decoder_positions_BT: Array | None = None, *,
               deterministic: bool = True, return_hidden: bool = False,
               return_attention: bool = False, lm_head: bool = True) -> dict[str, Any]:
    flags = dict(deterministic=deterministic, return_hidden=return_hidden,
                 return_attention=return_attention)
    enc_BSD, enc_extras = self.encode(encoder_tokens_BS, encoder_segment_ids_BS,
                                      encoder_positions_BS, **flags)
    logits_BTV, hidden_BTD, dec_extras = self.decode(
        enc_BSD, encoder_segment_ids_BS, decoder_tokens_BT,
        decoder_segment_ids_BT, decoder_positions_BT, lm_head=lm_head, **flags)
    out = {"last_hidden": hidden_BTD, "encoder_last_hidden": enc_BSD}
    if lm_head:
      out["logits"] = logits_BTV
    out.update({f"encoder_{k}": v for k, v in enc_extras.items()})
    out.update(dec_extras)
    return out


def lm_head_params(config: TransformerConfig, params: Any) -> dict[str, Any]:
  """The part of a model's ``params`` its LM head reads (a tied head: the
  token table too), as :func:`apply_lm_head` takes it."""
  names = ((paths.LM_HEAD, paths.TOKEN_EMBED) if config.tie_embeddings
           else (paths.LM_HEAD,))
  return {name: params[name] for name in names if name in params}


def apply_lm_head(config: TransformerConfig, head_params: Any, hidden_BTD: Array) -> Array:
  """The model's LM head on ``hidden_BTD`` alone, outside the model's apply."""
  embed = layers.token_embedding(config) if config.tie_embeddings else None
  variables = dict(head_params.get(paths.LM_HEAD, {}))
  if embed is not None:
    variables[paths.TOKEN_EMBED] = head_params[paths.TOKEN_EMBED]
  return layers.LMHead(config, embed).apply({"params": variables}, hidden_BTD)


def build_model(config: TransformerConfig, **kwargs: Any) -> nn.Module:
  """The Linen module for ``config.family`` (kwargs: e.g. ``name``)."""
  if family_of(config).seq2seq:
    return EncoderDecoder(config, **kwargs)
  return EncoderOrDecoder(config, **kwargs)
