"""TransformerConfig: the one frozen description of a model.

Config files (ml_collections) stop at the trainer; models only ever see this
dataclass, and each layer reads the explicit fields it needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxtl.models import paths
from jaxtl.models.family import NAMES, family_of
from jaxtl.runtime import xla_cpu

FAMILIES = NAMES  # each family's rules: jaxtl.models.family


def input_side(family: str) -> str:
  """Which batch features (``encoder_*`` / ``decoder_*``) a family's single
  stack reads (:attr:`jaxtl.models.family.Family.input_side`)."""
  return family_of(family).input_side


def target_side(family: str) -> str:
  """Which batch features carry a family's LM targets
  (:attr:`jaxtl.models.family.Family.target_side`)."""
  return family_of(family).target_side


REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# What an encoder-decoder's decoder reads first: T5's pad (also every jaxtl
# pretraining objective's), or EOS (BART as Hugging Face and fairseq ship it).
DECODER_STARTS = ("pad", "eos")


def _field(default: Any, meaning: str) -> Any:
  """A field's default and what it means, in one line: ``jaxtl config``
  shows it beside the key (jaxtl.configs.common.describe)."""
  return dataclasses.field(default=default, metadata={"meaning": meaning})


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Architecture hyper-parameters shared by the three model families.

  ``family`` picks the stack: ``encoder`` (BERT, bidirectional),
  ``decoder`` (GPT-2, causal) or ``encoder_decoder`` (T5).
  """
  family: str = _field("encoder", "the stack: encoder (BERT) | decoder (GPT-2) | "
                       "encoder_decoder (T5, BART)")
  vocab_size: int = _field(32000, "token vocabulary size; 0 in a config: the tokenizer's")
  d_model: int = _field(512, "hidden width of every layer")
  # Tokens, positions and token types are embedded (and normed) at width E
  # and projected up to d_model (ELECTRA's embedding_size, ALBERT's
  # factorised table); the tied LM head's transform maps back to E.
  embed_dim: int = _field(0, "embedding width E, projected up to d_model; 0: d_model")
  num_heads: int = _field(8, "attention heads per layer")
  head_dim: int = _field(64, "width of each attention head")
  mlp_dim: int = _field(2048, "hidden width of each MLP block")
  num_layers: int = _field(6, "layers (the encoder's, for encoder_decoder)")
  num_decoder_layers: int = _field(0, "encoder_decoder: the decoder's layers; 0: num_layers")
  max_len: int = _field(512, "longest input: the size of the learned position table")
  position: str = _field("learned", "positions: learned (BERT, GPT-2) | relative (T5)")
  relative_buckets: int = _field(32, "relative positions: buckets of the attention bias")
  relative_max_distance: int = _field(128, "relative positions: distances from this on "
                                      "share the last bucket")
  type_vocab_size: int = _field(0, "token types (segments A/B) embedded; 0: none")
  # The head is BERT's pooler + classifier on [CLS]: next-sentence or
  # sentence-order prediction.
  sentence_classes: int = _field(0, "classes of a sentence-pair pretraining head (2); 0: none")
  activation: str = _field("gelu", "MLP activation: gelu | gelu_new | relu | silu")
  gated_mlp: bool = _field(False, "gated MLP (T5 v1.1's gated GELU)")
  norm: str = _field("layernorm", "normalisation: layernorm | rmsnorm")
  norm_eps: float = _field(1e-12, "epsilon of every norm")
  norm_impl: str = _field("xla", "norms' kernels: xla | pallas (one Pallas kernel each "
                          "way, for GPUs; jaxtl.models.norm_kernel)")
  pre_norm: bool = _field(True, "norm before each block (GPT-2, T5); False: after it (BERT)")
  embed_norm: bool = _field(False, "norm right after the embeddings (BERT)")
  use_bias: bool = _field(True, "biases in dense layers (T5 has none)")
  scale_attention: bool = _field(True, "scale attention scores by 1/sqrt(head_dim) "
                                 "(T5 folds it into init)")
  dropout_rate: float = _field(0.1, "dropout on activations while training")
  attention_dropout_rate: float = _field(0.0, "dropout on attention weights while training")
  tie_embeddings: bool = _field(True, "the LM head reuses the token embedding table")
  scale_tied_logits: bool = _field(False, "T5 v1.0: scale hidden states by d_model**-0.5 "
                                   "before the tied head")
  lm_head_transform: bool = _field(False, "dense + activation + norm before the LM "
                                   "logits (BERT)")
  lm_head_bias: bool = _field(False, "an output bias on the LM logits")
  decoder_start: str = _field("pad", "encoder_decoder: the decoder's first token: pad "
                              "(T5) | eos (BART)")
  init_std: float = _field(0.02, "standard deviation of initial weights")
  dtype: str = _field("float32", "compute dtype: float32 | bfloat16; a recipe's auto "
                      "is bfloat16 on GPUs and TPUs, bfloat16 with row_major_dots "
                      "on CPUs whose bf16 matmuls are twice float32's, float32 on "
                      "other CPUs")
  param_dtype: str = _field("float32", "dtype the parameters are stored in")
  scan_layers: bool = _field(False, "compile one layer and scan it (faster compiles)")
  remat: str = _field("none", "activations recomputed in the backward pass (less "
                      "memory): none | full | dots | dots_no_batch")
  row_major_dots: bool = _field(False, "dense layers' matmuls as row-major dots with "
                               "float32 accumulation, backward included (XLA:CPU's "
                               "fast kernels; jaxtl.models.dense_dots); bfloat16 "
                               "sets it on CPUs where it pays, float32 on an AMX Xeon "
                               "and a Zen 3 EPYC")
  attention_impl: str | None = _field(None, "attention kernel: xla | cudnn | einsum; "
                                      "None (\"\" in a config): automatic")
  # Parameter-efficient adaptation (0 = off); fine-tuning sets them from
  # config.adapt.
  adapter_dim: int = _field(0, "bottleneck width of adapters after attention and "
                            "MLP; 0: none")
  lora_rank: int = _field(0, "rank of LoRA updates; 0: none")
  lora_alpha: float = _field(16.0, "LoRA's scale: updates are multiplied by alpha / rank")
  lora_dropout: float = _field(0.0, "dropout on LoRA's input")
  lora_targets: tuple[str, ...] = _field((paths.QUERY, paths.VALUE),
                                         "projections LoRA adapts: of query, key, "
                                         "value, out")

  def __post_init__(self):
    checks = {
        "family": (self.family, FAMILIES),
        "position": (self.position, ("learned", "relative")),
        "norm": (self.norm, ("layernorm", "rmsnorm")),
        "norm_impl": (self.norm_impl, ("xla", "pallas")),
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
  def from_mapping(cls, values: Mapping[str, Any],
                   keep_float32: str | None = "--config.model.dtype=float32"
                   ) -> "TransformerConfig":
    """Builds from a config dict, naming any key the dataclass lacks;
    ``keep_float32``: see :func:`precision`."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown model config keys {unknown}; known: {sorted(known)}")
    values = {**values, **precision(values, keep_float32)}
    if values.get("attention_impl") == "":  # config files cannot hold None.
      values["attention_impl"] = None
    return cls(**values)


# What a config's model.dtype may say.
DTYPES = ("auto", "float32", "bfloat16")


def check_dtype(values: Mapping[str, Any]) -> None:
  """A config dict's dtype is one of `DTYPES`, else an error naming the key."""
  if values.get("dtype", "float32") not in DTYPES:
    raise ValueError(f"config.model.dtype={values['dtype']!r}; expected one of "
                     f"{', '.join(DTYPES)}")


def precision(values: Mapping[str, Any],
              keep_float32: str | None = "--config.model.dtype=float32") -> dict[str, Any]:
  """A config dict's dtype and row_major_dots, its dtype ``auto`` (the
  recipes' default) as :func:`jaxtl.runtime.xla_cpu.auto_precision` picks
  it on this backend: bfloat16 on GPUs and TPUs, bfloat16 with row-major
  dots on a CPU where that pays, float32 on other CPUs. A bfloat16 pick is
  logged naming ``keep_float32``, the switch that keeps float32; None
  decides without a word."""
  check_dtype(values)
  dtype = values.get("dtype", "float32")
  if dtype == "auto":
    dtype = xla_cpu.auto_precision(jax.default_backend(), keep_float32)
  return {"dtype": dtype, "row_major_dots": with_row_major_dots(
      dtype, values.get("row_major_dots", False))}


def with_row_major_dots(dtype: str, asked: bool) -> bool:
  """Row-major dots for a model computing in ``dtype``: where asked for,
  and for bfloat16 on a CPU where they pay however bfloat16 was chosen
  (:func:`jaxtl.runtime.xla_cpu.row_major_dots`)."""
  return asked or xla_cpu.row_major_dots(jax.default_backend(), dtype)


def computing_in(cfg: TransformerConfig, compute_dtype: str,
                 keep_float32: str | None = "--compute_dtype=float32") -> TransformerConfig:
  """``cfg`` computing in ``compute_dtype`` (float32, bfloat16, or auto:
  what :func:`jaxtl.runtime.xla_cpu.auto_precision` picks on this backend);
  "" keeps it. For a loaded model, so that the machine that runs it decides:
  a model tuned in bfloat16 where that paid computes in float32 on an AVX2
  CPU, where bfloat16 is slower, and one trained with ``norm_impl=pallas``
  on a GPU runs XLA's norms elsewhere."""
  if compute_dtype not in (*DTYPES, ""):
    raise ValueError(f"compute_dtype={compute_dtype!r}; expected auto, float32 or "
                     "bfloat16")
  # The norms' Pallas kernels are GPU kernels: elsewhere they would run
  # interpreted, so a model trained with them on a GPU loads with XLA's norms.
  if cfg.norm_impl == "pallas" and jax.default_backend() != "gpu":
    cfg = cfg.replace(norm_impl="xla")
  if compute_dtype == "auto":  # this machine decides both
    dtype = xla_cpu.auto_precision(jax.default_backend(), keep_float32)
    return cfg.replace(dtype=dtype, row_major_dots=with_row_major_dots(dtype, False))
  dtype = compute_dtype or cfg.dtype
  return cfg.replace(dtype=dtype, row_major_dots=with_row_major_dots(dtype, cfg.row_major_dots))
