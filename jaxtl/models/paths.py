"""The names of every parameter: the one place the tree's layout is written.

The model modules name their submodules with these constants, and the code
that matches parameters by name (Hugging Face conversion tables, weight-decay
masks, per-layer learning rates, freezing schemes, LoRA merging, beam-search
cache reordering) builds its paths and regexes from here, so renaming a
module is one edit and ``tests/paths_test.py`` checks the contract against
real trees. The tree of ``build_model(config).init(...)["params"]``::

  token_embed/embedding                       [V, E], shared by every stack
  stack/                                      T5: encoder/ and decoder/
    embedder/position_embedding               [P, E] learned positions
    embedder/token_type_embedding             [Y, E] (BERT)
    embedder/norm/{scale,bias}                (BERT)
    embedder/embed_project/{kernel,bias}      [E, D] when embed_dim sets E != D
    relative_bias/rel_embedding               [N, H] (T5)
    layer_{i}/                                layers/ when scanned: [L, ...]
      self_attention/{query,key,value,out}_{kernel,bias,lora_a,lora_b}
      self_attention_norm/{scale,bias}
      self_attention_adapter/{down,up}/{kernel,bias}
      cross_attention/..., cross_attention_norm/...   (T5's decoder)
      mlp/{wi | wi_0,wi_1, wo}/{kernel,bias}
      mlp_norm/..., mlp_adapter/...
    final_norm/{scale,bias}                   (pre-norm models)
  lm_head/transform/..., transform_norm/..., logits/kernel, bias
  sentence_head/{pooler,out}/{kernel,bias}    (NSP / SOP: sentence_classes)

A :class:`jaxtl.models.heads.TaskModel` holds that tree (without
``lm_head``) under ``backbone/``, its head under ``head/{pooler,out}`` and
an ELMo mix under ``scalar_mix/{weights,gamma}``. E.g. layer 3's query
kernel: ``join(STACK, layer(3), SELF_ATTENTION, kernel(QUERY))``.
"""

from __future__ import annotations

import re

# Leaves, as Flax names them.
KERNEL, BIAS, SCALE, EMBEDDING = "kernel", "bias", "scale", "embedding"

# Top level of a backbone.
TOKEN_EMBED = "token_embed"
STACK = "stack"  # encoder-only and decoder-only models
ENCODER, DECODER = "encoder", "decoder"  # encoder-decoder models
STACKS = (STACK, ENCODER, DECODER)
LM_HEAD = "lm_head"

# Inside a stack.
EMBEDDER = "embedder"
POSITION_EMBEDDING, TOKEN_TYPE_EMBEDDING = "position_embedding", "token_type_embedding"
EMBED_NORM = "norm"
RELATIVE_BIAS, REL_EMBEDDING = "relative_bias", "rel_embedding"
LAYERS = "layers"  # all layers under nn.scan, each leaf with a leading layer axis
FINAL_NORM = "final_norm"
# Depth 0 for per-layer learning rates: what feeds the first layer.
EMBEDDING_MODULES = (TOKEN_EMBED, EMBEDDER, RELATIVE_BIAS)

# Inside a layer: sublayers, each with a norm (and an adapter) beside it.
SELF_ATTENTION, CROSS_ATTENTION, MLP = "self_attention", "cross_attention", "mlp"
QUERY, KEY, VALUE, OUT = "query", "key", "value", "out"
PROJECTIONS = (QUERY, KEY, VALUE, OUT)  # attention's; LoRA's possible targets
WI, WI_0, WI_1, WO = "wi", "wi_0", "wi_1", "wo"  # the MLP's (wi_0, wi_1: gated)
ADAPTER_DOWN, ADAPTER_UP = "down", "up"

# Inside the LM head (its output bias is a BIAS leaf).
TRANSFORM, TRANSFORM_NORM, LOGITS = "transform", "transform_norm", "logits"

# The embedder's projection from a narrower token table (embed_dim) to d_model.
EMBED_PROJECT = "embed_project"
# ELECTRA's pretrainer (jaxtl.models.electra): beside the discriminator's
# token_embed/ and stack/, a generator (its own stack/ and lm_head/) and the
# replaced-token head.
GENERATOR, DISCRIMINATOR_HEAD = "generator", "discriminator_head"
# The sentence-pair head of NSP / SOP pretraining (inside a backbone, beside
# lm_head): sentence_head/{pooler,out}/{kernel,bias}.
SENTENCE_HEAD = "sentence_head"

# A TaskModel.
BACKBONE, HEAD, SCALAR_MIX = "backbone", "head", "scalar_mix"
POOLER, HEAD_OUT = "pooler", "out"  # inside HEAD (BERT's pooler, the classifier)
MIX_WEIGHTS, MIX_GAMMA = "weights", "gamma"


def join(*parts: str) -> str:
  """A ``/``-joined path (the separator every name-matcher here uses)."""
  return "/".join(parts)


TOKEN_TABLE = join(TOKEN_EMBED, EMBEDDING)  # tied LM heads read it too


_LAYER_PREFIX = "layer_"


def layer(i: int) -> str:
  """Layer ``i``'s module name in an unscanned stack."""
  return f"{_LAYER_PREFIX}{i}"


def norm(sublayer: str) -> str:
  """The norm beside a sublayer (before it pre-norm, after it post-norm)."""
  return f"{sublayer}_norm"


def adapter(sublayer: str) -> str:
  return f"{sublayer}_adapter"


# An attention projection's parameters; ``projection`` may be a whole path
# (``.../self_attention/query``), so merging LoRA finds the kernel beside it.
def kernel(projection: str) -> str:
  return f"{projection}_{KERNEL}"


def bias(projection: str) -> str:
  return f"{projection}_{BIAS}"


_LORA_A, _LORA_B = "_lora_a", "_lora_b"


def lora_a(projection: str) -> str:
  return projection + _LORA_A


def lora_b(projection: str) -> str:
  return projection + _LORA_B


def lora_projection(path: str) -> str | None:
  """The projection whose LoRA A matrix ``path`` is (``lora_a``'s inverse)."""
  return path.removesuffix(_LORA_A) if path.endswith(_LORA_A) else None


_LAYER_INDEX = re.compile(rf"(?:^|/){_LAYER_PREFIX}(\d+)(?:/|$)")


def layer_index(path: str) -> int | None:
  """``i`` for a parameter inside ``layer_{i}``; None outside the layers."""
  match = _LAYER_INDEX.search(path)
  return int(match.group(1)) if match else None


def is_scanned(path: str) -> bool:
  """Inside scanned layers: the leaf's leading axis is the layer."""
  return LAYERS in path.split("/")


# Regexes searched in a ``/``-joined path.
NORM_RE = r"(?:^|/|_)norm/"  # a LayerNorm / RMSNorm's scale and bias
# Dense and attention biases, the LM head's output bias, and T5's
# relative_bias table (a learned bias on the attention logits).
BIAS_RE = r"(?:^|/|_)bias(?:/|$)"
NO_DECAY_RE = f"{NORM_RE}|{BIAS_RE}"  # weight decay would pull these to zero
ADAPTER_RE = r"_adapter/"
LORA_RE = f"(?:{_LORA_A}|{_LORA_B})$"


def under(prefix: str, excluding: tuple[str, ...] = ()) -> str:
  """Regex of the parameters under ``prefix`` that match none of ``excluding``.

  As a freeze pattern: ``under(BACKBONE)`` freezes the backbone;
  ``under(BACKBONE, (LORA_RE,))`` freezes all of it but the LoRA matrices.
  """
  if not excluding:
    return f"^{prefix}/"
  return f"^{prefix}/(?!.*(?:{'|'.join(excluding)}))"


# Every parameter path a backbone can have, by kind (``tests/paths_test.py``
# checks that each path of real trees matches exactly one).
_STACK = f"(?:{'|'.join(STACKS)})"
_LAYER = rf"(?:{_LAYER_PREFIX}\d+|{LAYERS})"
_PROJECTION = f"(?:{'|'.join(PROJECTIONS)})"
_ATTENTION = f"(?:{SELF_ATTENTION}|{CROSS_ATTENTION})"
_SUBLAYER = f"(?:{SELF_ATTENTION}|{CROSS_ATTENTION}|{MLP})"
_DENSE = f"(?:{KERNEL}|{BIAS})"
_NORM = f"(?:{SCALE}|{BIAS})"
PARAM_KINDS = {
    "embedding": (f"{TOKEN_EMBED}/{EMBEDDING}|{_STACK}/{EMBEDDER}/"
                  f"(?:{POSITION_EMBEDDING}|{TOKEN_TYPE_EMBEDDING})"),
    "embed_project": f"{_STACK}/{EMBEDDER}/{EMBED_PROJECT}/{_DENSE}",
    "relative_bias": f"{_STACK}/{RELATIVE_BIAS}/{REL_EMBEDDING}",
    "norm": (f"(?:{_STACK}/(?:{EMBEDDER}/{EMBED_NORM}|{FINAL_NORM}"
             f"|{_LAYER}/{norm(_SUBLAYER)})|{LM_HEAD}/{TRANSFORM_NORM})/{_NORM}"),
    "attention": f"{_STACK}/{_LAYER}/{_ATTENTION}/{_PROJECTION}_{_DENSE}",
    "lora": f"{_STACK}/{_LAYER}/{_ATTENTION}/{_PROJECTION}{LORA_RE}",
    "mlp": f"{_STACK}/{_LAYER}/{MLP}/(?:{WI}|{WI_0}|{WI_1}|{WO})/{_DENSE}",
    "adapter": (f"{_STACK}/{_LAYER}/{adapter(f'(?:{SELF_ATTENTION}|{MLP})')}/"
                f"(?:{ADAPTER_DOWN}|{ADAPTER_UP})/{_DENSE}"),
    "lm_head": f"{LM_HEAD}/(?:{TRANSFORM}/{_DENSE}|{LOGITS}/{KERNEL}|{BIAS})",
    "sentence_head": f"{SENTENCE_HEAD}/(?:{POOLER}|{HEAD_OUT})/{_DENSE}",
}
TASK_PARAM_KINDS = {  # a TaskModel's own, beside its backbone/
    # ELECTRA's detection head sits here when imported or exported.
    "head": (f"{HEAD}/(?:{POOLER}|{HEAD_OUT}|{DISCRIMINATOR_HEAD}/(?:{TRANSFORM}|{LOGITS}))"
             f"/{_DENSE}"),
    "scalar_mix": f"{SCALAR_MIX}/(?:{MIX_WEIGHTS}|{MIX_GAMMA})",
}
_KIND_RES = {**{k: re.compile(f"(?:{BACKBONE}/)?(?:{v})")
                for k, v in PARAM_KINDS.items()},
             **{k: re.compile(v) for k, v in TASK_PARAM_KINDS.items()}}


def kind(path: str) -> str | None:
  """The kind (a key of ``PARAM_KINDS`` or ``TASK_PARAM_KINDS``) of a
  parameter path; None for one no model builds, or that two kinds claim."""
  found = [k for k, r in _KIND_RES.items() if r.fullmatch(path)]
  return found[0] if len(found) == 1 else None
