"""ELECTRA's pretraining model: a small MLM generator and a discriminator
that share one token table (Clark et al. 2020).

The discriminator's parameters sit at the top of the tree exactly as an
encoder's (``token_embed/``, ``stack/``), so an ELECTRA workdir transfers
like a BERT one: what is left over, ``generator/`` and
``discriminator_head/``, is pretraining-only and dropped on transfer
(:func:`discriminator`). The tree::

  token_embed/embedding               [V, E], E = the discriminator's embed_width
  stack/...                           the discriminator (an encoder stack)
  discriminator_head/{transform,logits}/{kernel,bias}   replaced or not
  generator/
    stack/...                         the generator's encoder stack (width G);
                                      its embedder projects E -> G when G != E
    lm_head/{transform,transform_norm}/..., bias   G -> E, tied to the table

The generator is an encoder whose ``embed_dim`` is the table's width, so
alone (:func:`generator_as_encoder`) it is what Hugging Face's
``ElectraForMaskedLM`` with ``embedding_size`` E computes.
"""

from __future__ import annotations

import functools

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtl.models import layers, paths
from jaxtl.models.config import TransformerConfig
from jaxtl.models.transformer import Stack

Array = jax.Array

# What an ELECTRA tree holds besides the discriminator's encoder.
PRETRAINING_ONLY = (paths.GENERATOR, paths.DISCRIMINATOR_HEAD)


def generator_config(discriminator: TransformerConfig, scale: float,
                     num_layers: int = 0) -> TransformerConfig:
  """The generator: the discriminator's width, heads and MLP times ``scale``
  (the paper finds 1/4 to 1/2 best), ``num_layers`` deep (0: as deep),
  reading the discriminator's token table (``embed_dim``) and predicting
  into it through a BERT-style head, as a standalone MLM encoder would.

  When the discriminator's heads fill its width (BERT's and ELECTRA's
  shape), so do the generator's, as Hugging Face's ``ElectraForMaskedLM``
  needs: head width = width / heads wherever the heads divide the width
  (the paper's 64 at its sizes; one head of 32 for bert_tiny at 1/4), and
  the discriminator's head width otherwise."""
  if not 0 < scale <= 1:
    raise ValueError(f"config.objective.generator_scale must be in (0, 1], got {scale}")
  size = lambda n: max(1, round(n * scale))
  width, table = size(discriminator.d_model), discriminator.embed_width
  heads, head_dim = size(discriminator.num_heads), discriminator.head_dim
  if discriminator.num_heads * head_dim == discriminator.d_model and width % heads == 0:
    head_dim = width // heads
  return discriminator.replace(
      d_model=width, num_heads=heads, head_dim=head_dim,
      mlp_dim=size(discriminator.mlp_dim),
      num_layers=num_layers or discriminator.num_layers,
      embed_dim=0 if table == width else table, lm_head_transform=True,
      lm_head_bias=True, tie_embeddings=True, scale_tied_logits=False)


class DiscriminatorHead(nn.Module):
  """Dense + activation + one logit per token: "was this token replaced?"."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BTD: Array) -> Array:
    cfg = self.config
    dense = functools.partial(layers.dense, cfg)
    h_BTD = dense(cfg.d_model, ("embed", "mlp"), paths.TRANSFORM, cfg.jnp_dtype)(x_BTD)
    h_BTD = layers.activation_fn(cfg.activation)(h_BTD)
    return dense(1, ("mlp", "labels"), paths.LOGITS, jnp.float32)(h_BTD)[..., 0]


class Generator(nn.Module):
  """A BERT-style MLM encoder reading (and predicting into) a shared table."""
  config: TransformerConfig  # generator_config's: embed_width = the table's
  token_embed: nn.Module

  def setup(self):
    cfg = self.config
    if cfg.embed_width != self.token_embed.features:
      raise ValueError(f"the generator's embed_width {cfg.embed_width} differs from the "
                       f"shared token table's width {self.token_embed.features} "
                       "(use models.electra.generator_config)")
    self.stack = Stack(cfg, cfg.num_layers, causal=False, token_embed=self.token_embed)
    self.lm_head = layers.LMHead(cfg, self.token_embed)

  def __call__(self, tokens_BT: Array, segment_ids_BT: Array | None,
               positions_BT: Array | None, token_types_BT: Array | None, *,
               deterministic: bool = True) -> Array:
    """The last hidden states [B, T, G]."""
    return self.stack(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                      deterministic=deterministic)[0]

  def logits(self, hidden_BKG: Array) -> Array:
    return self.lm_head(hidden_BKG)


class ElectraPretrainer(nn.Module):
  """Generator + discriminator, trained jointly (see
  :mod:`jaxtl.objectives.electra` for the loss).

  ``config`` is the discriminator's: it is what a workdir records and what
  transfers. ``generator_config`` (:func:`generator_config`) reads its token table.
  """
  config: TransformerConfig
  generator_config: TransformerConfig

  def setup(self):
    # The attribute names are the parameter names (see the module docstring).
    cfg = self.config
    if cfg.family != "encoder":
      raise ValueError(f"ELECTRA trains an encoder; config.model.family is {cfg.family!r}")
    self.token_embed = layers.token_embedding(cfg)
    self.stack = Stack(cfg, cfg.num_layers, causal=False, token_embed=self.token_embed)
    self.discriminator_head = DiscriminatorHead(cfg)
    self.generator = Generator(self.generator_config, self.token_embed)

  def generator_logits(self, tokens_BT: Array, at_BK: Array,
                       segment_ids_BT: Array | None = None,
                       positions_BT: Array | None = None,
                       token_types_BT: Array | None = None, *,
                       deterministic: bool = True) -> Array:
    """The generator's vocabulary logits at positions ``at_BK`` only: [B, K, V]."""
    hidden_BTG = self.generator(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                                deterministic=deterministic)
    hidden_BKG = jnp.take_along_axis(hidden_BTG, at_BK[..., None], axis=1)
    return self.generator.logits(hidden_BKG)

  def discriminate(self, tokens_BT: Array, segment_ids_BT: Array | None = None,
                   positions_BT: Array | None = None,
                   token_types_BT: Array | None = None, *,
                   deterministic: bool = True) -> dict[str, Array]:
    """The discriminator's last hidden states and replaced-token logits [B, T]."""
    hidden_BTD, _ = self.stack(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                               deterministic=deterministic)
    return {"last_hidden": hidden_BTD, "rtd_logits": self.discriminator_head(hidden_BTD)}

  def __call__(self, tokens_BT: Array, segment_ids_BT: Array | None = None,
               positions_BT: Array | None = None, token_types_BT: Array | None = None,
               *, deterministic: bool = True) -> dict[str, Any]:
    """Both halves on the same tokens (what ``init`` traces): the
    discriminator's outputs and the generator's logits everywhere."""
    at_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    return {**self.discriminate(tokens_BT, segment_ids_BT, positions_BT, token_types_BT,
                                deterministic=deterministic),
            "generator_logits": self.generator_logits(
                tokens_BT, at_BT, segment_ids_BT, positions_BT, token_types_BT,
                deterministic=deterministic)}


def discriminator(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(the discriminator's encoder tree, the pretraining-only rest) of an
  ELECTRA tree: the first is ``build_model(config)``'s tree minus its LM head."""
  return ({k: v for k, v in params.items() if k not in PRETRAINING_ONLY},
          {k: v for k, v in params.items() if k in PRETRAINING_ONLY})


def is_electra(params: dict[str, Any]) -> bool:
  """Whether a checkpoint's parameters are an ELECTRA pretrainer's."""
  return all(name in params for name in PRETRAINING_ONLY)


def generator_as_encoder(generator_config: TransformerConfig, params: dict[str, Any]
                         ) -> tuple[TransformerConfig, dict[str, Any]]:
  """The generator alone as an encoder with a BERT-style LM head: what
  ``build_model`` runs and Hugging Face's ``ElectraForMaskedLM`` holds
  (with ``embedding_size`` the table's width when the generator is narrower)."""
  generator = params[paths.GENERATOR]
  return generator_config, {paths.TOKEN_EMBED: params[paths.TOKEN_EMBED],
                            paths.STACK: generator[paths.STACK],
                            paths.LM_HEAD: generator[paths.LM_HEAD]}
