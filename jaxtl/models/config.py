"""TransformerConfig: the one frozen description of a model.

Config files (ml_collections) stop at the trainer; models only ever see this
dataclass, and each layer reads the explicit fields it needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from jaxtl.models import paths

FAMILIES = ("encoder", "decoder", "encoder_decoder")


def input_side(family: str) -> str:
  """Which batch features (``encoder_*`` / ``decoder_*``) a family's single
  stack reads: causal models read ``decoder_*``; BERT and T5's encoder
  ``encoder_*`` (T5 also reads ``decoder_*`` for its decoder)."""
  return "decoder" if family == "decoder" else "encoder"


def target_side(family: str) -> str:
  """Which batch features carry a family's LM targets: the encoder's for
  masked LM, the decoder's for causal and encoder-decoder models."""
  return "encoder" if family == "encoder" else "decoder"
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# What an encoder-decoder's decoder reads first: T5's pad (also every jaxtl
# pretraining objective's), or EOS (BART as Hugging Face and fairseq ship it).
DECODER_STARTS = ("pad", "eos")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Architecture hyper-parameters shared by the three model families.

  ``family`` picks the stack: ``encoder`` (BERT, bidirectional),
  ``decoder`` (GPT-2, causal) or ``encoder_decoder`` (T5).
  """
  family: str = "encoder"
  vocab_size: int = 32000
  d_model: int = 512
  # >0 and != d_model: tokens, positions and token types are embedded (and
  # normed) at this width E and projected up to d_model (ELECTRA's
  # embedding_size, ALBERT's factorised table); the tied LM head's
  # transform maps back to E. 0: d_model.
  embed_dim: int = 0
  num_heads: int = 8
  head_dim: int = 64
  mlp_dim: int = 2048
  num_layers: int = 6
  num_decoder_layers: int = 0  # encoder_decoder only; 0 means num_layers.
  max_len: int = 512  # size of the learned position table.
  position: str = "learned"  # "learned" (BERT, GPT-2) or "relative" (T5).
  relative_buckets: int = 32
  relative_max_distance: int = 128
  type_vocab_size: int = 0  # >0 adds token-type (segment A/B) embeddings.
  # >0 adds BERT's sentence-pair head (pooler + classifier on [CLS]) for
  # next-sentence / sentence-order prediction: 2 classes.
  sentence_classes: int = 0
  activation: str = "gelu"  # gelu | gelu_new | relu | silu
  gated_mlp: bool = False  # T5 v1.1 gated-GELU.
  norm: str = "layernorm"  # layernorm | rmsnorm
  norm_eps: float = 1e-12
  pre_norm: bool = True  # False: post-LN (BERT).
  embed_norm: bool = False  # norm right after the embeddings (BERT).
  use_bias: bool = True  # biases in dense layers (T5 has none).
  scale_attention: bool = True  # 1/sqrt(head_dim); T5 folds it into init.
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  tie_embeddings: bool = True
  scale_tied_logits: bool = False  # T5 v1.0: hidden * d_model**-0.5 first.
  lm_head_transform: bool = False  # BERT: dense + act + norm before logits.
  lm_head_bias: bool = False
  decoder_start: str = "pad"  # encoder_decoder: of DECODER_STARTS
  init_std: float = 0.02
  dtype: str = "float32"  # compute dtype.
  param_dtype: str = "float32"
  scan_layers: bool = False
  remat: str = "none"
  attention_impl: str | None = None  # None (auto) | "xla" | "cudnn" | "einsum"
  # Parameter-efficient adaptation (0 = off).
  adapter_dim: int = 0  # Houlsby bottleneck after attention and MLP.
  lora_rank: int = 0
  lora_alpha: float = 16.0  # LoRA update scale is alpha / rank.
  lora_dropout: float = 0.0
  lora_targets: tuple[str, ...] = (paths.QUERY, paths.VALUE)  # of paths.PROJECTIONS

  def __post_init__(self):
    checks = {
        "family": (self.family, FAMILIES),
        "position": (self.position, ("learned", "relative")),
        "norm": (self.norm, ("layernorm", "rmsnorm")),
        "remat": (self.remat, REMAT_POLICIES),
        "attention_impl": (self.attention_impl, (None, "xla", "cudnn", "einsum")),
        "decoder_start": (self.decoder_start, DECODER_STARTS),
    }
    for name, (value, allowed) in checks.items():
      if value not in allowed:
        raise ValueError(f"TransformerConfig.{name}={value!r}; expected one of {allowed}")
    bad_targets = set(self.lora_targets) - set(paths.PROJECTIONS)
    if bad_targets:
      raise ValueError(f"TransformerConfig.lora_targets has {sorted(bad_targets)}; "
                       f"LoRA applies to {', '.join(paths.PROJECTIONS)}")
    for name in ("vocab_size", "d_model", "num_heads", "head_dim", "mlp_dim",
                 "num_layers", "max_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"TransformerConfig.{name} must be positive, got {getattr(self, name)}")
    if self.embed_dim < 0:
      raise ValueError("TransformerConfig.embed_dim must be >= 0 (0: d_model), "
                       f"got {self.embed_dim}")
    if self.embed_width != self.d_model and self.tie_embeddings and not self.lm_head_transform:
      raise ValueError(f"TransformerConfig.embed_dim={self.embed_dim} with "
                       f"d_model={self.d_model}: a tied LM head reads the [vocab, "
                       "embed_dim] table, so it needs lm_head_transform=True "
                       "(d_model -> embed_dim) or tie_embeddings=False")

  @property
  def jnp_dtype(self) -> Any:
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self) -> Any:
    return jnp.dtype(self.param_dtype)

  @property
  def embed_width(self) -> int:
    """The token table's width E: ``embed_dim``, or d_model when 0."""
    return self.embed_dim or self.d_model

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  def decoder_start_id(self, pad_id: int, eos_id: int | None) -> int:
    """The token id the decoder reads first, given the tokenizer's pad and
    EOS: the one place that decides it, so teacher forcing, scoring and
    generation agree with each other and with the checkpoint's training."""
    if self.decoder_start == "pad":
      return pad_id
    if eos_id is None:
      raise ValueError("this model's decoder starts from EOS (decoder_start='eos', "
                       "as Hugging Face BART), but no EOS id was given")
    return eos_id

  def replace(self, **changes: Any) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any]) -> "TransformerConfig":
    """Builds from a config dict, naming any key the dataclass lacks."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown model config keys {unknown}; known: {sorted(known)}")
    values = dict(values)
    if values.get("attention_impl") == "":  # config files cannot hold None.
      values["attention_impl"] = None
    return cls(**values)
