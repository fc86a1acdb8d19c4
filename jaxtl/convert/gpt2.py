"""GPT-2 (``GPT2Model``, ``GPT2LMHeadModel`` and the task classes).

Pre-LN blocks with a final LayerNorm, tanh GELU, learned positions and a
head tied to the token table. Its ``Conv1D`` layers store ``[in, out]`` and
``c_attn`` holds q, k and v side by side. The task heads (``score``,
``classifier``, ``qa_outputs``) are ``nn.Linear`` s over the final states;
``score`` has no bias (see :func:`fold_score_bias`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import traverse_util

from jaxtl.convert import rules as R
from jaxtl.convert.family import Family, SpecialIds, activation_from_hf, get
from jaxtl.models import paths as P
from jaxtl.models.config import TransformerConfig


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
  d, h = get(hf, "n_embd"), get(hf, "n_head")
  if d % h:
    raise ValueError(f"n_embd={d} is not a multiple of n_head={h}")
  unsupported = {k: hf[k] for k, ok in (("scale_attn_by_inverse_layer_idx", False),
                                        ("scale_attn_weights", True),
                                        ("add_cross_attention", False),
                                        ("tie_word_embeddings", True))
                 if k in hf and hf[k] != ok}
  if unsupported:
    raise ValueError(f"GPT-2 options jaxtl does not implement: {unsupported}")
  return TransformerConfig(
      family="decoder", vocab_size=get(hf, "vocab_size"), d_model=d, num_heads=h,
      head_dim=d // h, mlp_dim=hf.get("n_inner") or 4 * d,
      num_layers=get(hf, "n_layer"), max_len=get(hf, "n_positions"),
      activation=activation_from_hf(hf.get("activation_function", "gelu_new")),
      norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5), pre_norm=True,
      use_bias=True, scale_attention=True, dropout_rate=hf.get("resid_pdrop", 0.1),
      attention_dropout_rate=hf.get("attn_pdrop", 0.1), tie_embeddings=True,
      init_std=hf.get("initializer_range", 0.02))


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  return {
      "model_type": "gpt2", "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model,
      "n_head": cfg.num_heads, "n_inner": cfg.mlp_dim, "n_layer": cfg.num_layers,
      "n_positions": cfg.max_len, "activation_function": cfg.activation,
      "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout_rate,
      "embd_pdrop": cfg.dropout_rate, "attn_pdrop": cfg.attention_dropout_rate,
      "initializer_range": cfg.init_std, "tie_word_embeddings": True,
  }


def special_ids(cfg: TransformerConfig, ids: SpecialIds) -> dict[str, Any]:
  """The tokenizer's EOS (where ``generate`` stops), its BOS (its EOS where
  it has none, as GPT-2's one ``<|endoftext|>`` is both) and its pad id.
  Without them ``config.json`` would keep GPT2Config's 50256, which for
  any other vocabulary is no token at all."""
  del cfg  # the ids are the tokenizer's alone
  out: dict[str, Any] = {}
  if ids.eos is not None:
    out.update(eos_token_id=ids.eos, bos_token_id=ids.eos if ids.bos is None else ids.bos)
  if ids.pad is not None:
    out["pad_token_id"] = ids.pad
  return out


def rules(cfg: TransformerConfig) -> list[R.Rule]:
  out = [R.Rule("wte.weight", P.TOKEN_TABLE, "copy"),
         R.Rule("wpe.weight", P.join(P.STACK, P.EMBEDDER, P.POSITION_EMBEDDING), "copy")]
  for i in range(cfg.num_layers):
    hf, ours = f"h.{i}", P.join(P.STACK, P.layer(i))
    attn = P.join(ours, P.SELF_ATTENTION)
    for j, name in enumerate((P.QUERY, P.KEY, P.VALUE)):
      projection = P.join(attn, name)
      out += [R.Rule(f"{hf}.attn.c_attn.weight", P.kernel(projection), "conv1d",
                     part=(j, 3)),
              R.Rule(f"{hf}.attn.c_attn.bias", P.bias(projection), "vector",
                     part=(j, 3))]
    out_proj = P.join(attn, P.OUT)
    out += [R.Rule(f"{hf}.attn.c_proj.weight", P.kernel(out_proj), "conv1d", n_in=2),
            R.Rule(f"{hf}.attn.c_proj.bias", P.bias(out_proj), "vector")]
    out += R.norm_rules(f"{hf}.ln_1", P.join(ours, P.norm(P.SELF_ATTENTION)), bias=True)
    out += R.norm_rules(f"{hf}.ln_2", P.join(ours, P.norm(P.MLP)), bias=True)
    out += R.dense_rules(f"{hf}.mlp.c_fc", P.join(ours, P.MLP, P.WI), bias=True,
                         kind="conv1d")
    out += R.dense_rules(f"{hf}.mlp.c_proj", P.join(ours, P.MLP, P.WO), bias=True,
                         kind="conv1d")
  out += R.norm_rules("ln_f", P.join(P.STACK, P.FINAL_NORM), bias=True)
  head_out = P.join(P.HEAD, P.HEAD_OUT)
  out += R.dense_rules("score", head_out, bias=False, group="score")
  out += R.dense_rules("classifier", head_out, bias=True, group="classifier")
  out += R.dense_rules("qa_outputs", head_out, bias=True, group="qa")
  return out


_FINAL_NORM_BIAS = (P.STACK, P.FINAL_NORM, P.BIAS)


def fold_score_bias(params: Any, head: Any) -> tuple[Any, Any]:
  """Moves the classifier's bias into ``ln_f``'s, for the bias-free ``score``.

  In ``GPT2ForSequenceClassification`` nothing but ``score`` reads ``ln_f``'s
  output, so with ``W^T delta = b`` the logits ``W^T (h + delta)`` equal
  jaxtl's ``W^T h + b`` exactly (only the exported model's last hidden state
  moves by ``delta``). ``delta`` is the least-norm solution; it exists when
  the C class columns of ``W`` [D, C] are independent, the rule for C <= D.
  """
  out = dict(head.get(P.HEAD_OUT, {}))
  b = np.asarray(out.pop(P.BIAS, 0.0), np.float64)
  if not np.any(b):
    return params, {**head, P.HEAD_OUT: out}
  w = np.asarray(out[P.KERNEL], np.float64)  # [D, C]
  delta, *_ = np.linalg.lstsq(w.T, b, rcond=None)
  if np.abs(w.T @ delta - b).max() > 1e-6 * (1 + np.abs(b).max()):
    raise ValueError(
        "GPT2ForSequenceClassification's score layer has no bias, and this "
        f"classifier's bias cannot move into ln_f: its kernel {w.shape} has "
        "linearly dependent class columns")
  flat = traverse_util.flatten_dict(params)
  ln_bias = flat[_FINAL_NORM_BIAS]
  flat[_FINAL_NORM_BIAS] = (np.asarray(ln_bias, np.float64) + delta).astype(ln_bias.dtype)
  return traverse_util.unflatten_dict(flat), {**head, P.HEAD_OUT: out}


FAMILY = Family(
    model_type="gpt2", family="decoder", config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, rules=rules, base_prefix="transformer.",
    base_architecture="GPT2Model", base_groups=("base",),
    architectures={"GPT2LMHeadModel": ("base",), "GPT2Model": ("base",),
                   "GPT2ForSequenceClassification": ("base", "score"),
                   "GPT2ForTokenClassification": ("base", "classifier"),
                   "GPT2ForQuestionAnswering": ("base", "qa")},
    tied={"lm_head.weight": "wte.weight"},
    # The causal-mask buffers older checkpoints saved.
    ignored=(r"^h\.\d+\.attn\.(bias|masked_bias)$",),
    tasks={"generation": "GPT2LMHeadModel",  # the LM is the whole model
           "classification": "GPT2ForSequenceClassification",
           "regression": "GPT2ForSequenceClassification",
           "token_classification": "GPT2ForTokenClassification",
           "span_qa": "GPT2ForQuestionAnswering"},
    # The last token that is not pad_token_id.
    sequence_pooling="last",
    head_transforms={"GPT2ForSequenceClassification": fold_score_bias},
    special_ids=special_ids,
)
