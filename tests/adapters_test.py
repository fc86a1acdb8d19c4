"""Adapters and LoRA: identity at initialisation, LoRA merge equals unmerged."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from jaxtl.models import TransformerConfig, build_model
from jaxtl.models.layers import merge_lora

BASE = dict(family="decoder", vocab_size=64, d_model=16, num_heads=2,
            head_dim=8, mlp_dim=32, num_layers=2, max_len=16, dropout_rate=0.0)
TOKS = jax.random.randint(jax.random.key(3), (2, 7), 1, 64)


def init(cfg):
  return nn.unbox(build_model(cfg).init(jax.random.key(0), TOKS))["params"]


def logits(cfg, params):
  return build_model(cfg).apply({"params": params}, TOKS)["logits"]


def _strip(params, token):
  flat = traverse_util.flatten_dict(params, sep="/")
  return traverse_util.unflatten_dict(
      {k: v for k, v in flat.items() if token not in k}, sep="/")


@pytest.mark.slow
@pytest.mark.parametrize("extra", [dict(adapter_dim=4),
                                   dict(lora_rank=2, lora_targets=("query", "key", "value", "out"))])
@pytest.mark.parametrize("pre_norm", [True, False])
def test_fresh_adapters_and_lora_leave_the_model_unchanged(extra, pre_norm):
  plain = TransformerConfig(**BASE, pre_norm=pre_norm)
  adapted = plain.replace(**extra)
  params = init(adapted)
  names = "/".join(traverse_util.flatten_dict(params, sep="/"))
  assert ("adapter" in names) == ("adapter_dim" in extra)
  assert ("lora" in names) == ("lora_rank" in extra)
  base = _strip(_strip(params, "adapter"), "_lora_")
  np.testing.assert_allclose(logits(adapted, params), logits(plain, base), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_lora_merge_equals_unmerged(scan):
  cfg = TransformerConfig(**BASE, scan_layers=scan, lora_rank=3, lora_alpha=6.0,
                          lora_targets=("query", "value", "out"))
  params = init(cfg)
  # Give B real values so the update is not zero.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: (jax.random.normal(jax.random.key(len(str(path))), x.shape) * 0.1
                       if "lora_b" in str(path) else x), params)
  unmerged = logits(cfg, params)
  merged_params = merge_lora(params, cfg)
  plain = cfg.replace(lora_rank=0)
  assert jax.tree.structure(merged_params) == jax.tree.structure(init(plain))
  np.testing.assert_allclose(logits(plain, merged_params), unmerged, atol=1e-5)
  assert not np.allclose(logits(plain, _strip(params, "_lora_")), unmerged, atol=1e-3)


def test_bad_lora_target_is_named():
  with pytest.raises(ValueError, match="mlp"):
    TransformerConfig(**BASE, lora_rank=2, lora_targets=("mlp",))
