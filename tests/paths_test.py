"""Parameter paths: every path real trees have is one paths.py describes, and
every name-matcher built from paths.py (weight decay, layer depths, freezing
schemes, conversion tables, LoRA merging) picks exactly what it means to."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import traverse_util

from jaxtl.convert import hf
from jaxtl.models import TransformerConfig, build_model
from jaxtl.models import paths as P
from jaxtl.models.heads import TaskModel
from jaxtl.tasks.finetune import SCHEMES
from jaxtl.train import optim

BASE = dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, mlp_dim=32,
            num_layers=2, max_len=16)
FAMILIES = {  # every optional parameter of each family switched on
    "encoder": dict(family="encoder", type_vocab_size=2, sentence_classes=2, pre_norm=False,
                    embed_norm=True, lm_head_transform=True, lm_head_bias=True,
                    embed_dim=8),
    "decoder": dict(family="decoder"),
    "encoder_decoder": dict(family="encoder_decoder", position="relative",
                            norm="rmsnorm", use_bias=False, gated_mlp=True,
                            tie_embeddings=False, num_decoder_layers=3),
}
EXTRAS = {"plain": {}, "adapters": dict(adapter_dim=4),
          "lora": dict(lora_rank=2, lora_targets=P.PROJECTIONS)}
TOKENS = jnp.ones((1, 4), jnp.int32)


def config(family, extra="plain", scan=False):
  return TransformerConfig(**BASE, **FAMILIES[family], **EXTRAS[extra], scan_layers=scan)


def flat_params(module, *args):
  """``{path: ShapeDtypeStruct}`` of a module's parameters, none computed."""
  tree = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *args))["params"]
  return traverse_util.flatten_dict(tree, sep="/")


@functools.cache
def backbone_tree(family, extra="plain", scan=False):
  cfg = config(family, extra, scan)
  args = (TOKENS, TOKENS) if family == "encoder_decoder" else (TOKENS,)
  return flat_params(build_model(cfg), *args)


@functools.cache
def task_tree(family, extra="plain", scalar_mix=False):
  model = TaskModel(config(family, extra), pooling="pooler", scalar_mix=scalar_mix)
  return flat_params(model, TOKENS)


def nested(flat):
  return traverse_util.unflatten_dict(flat, sep="/")


ALL_TREES = [(f, e, s) for f in FAMILIES for e in EXTRAS for s in (False, True)]


@pytest.mark.parametrize("family,extra,scan", ALL_TREES)
def test_every_parameter_has_a_kind_and_a_layer(family, extra, scan):
  tree, cfg = backbone_tree(family, extra, scan), config(family, extra, scan)
  kinds = {p: P.kind(p) for p in tree}
  assert None not in kinds.values(), [p for p, k in kinds.items() if k is None]
  assert ("adapter" in kinds.values()) == (extra == "adapters")
  assert ("lora" in kinds.values()) == (extra == "lora")
  stacks = {P.ENCODER: cfg.num_layers, P.DECODER: cfg.decoder_layers,
            P.STACK: cfg.num_layers}
  for stack, n in stacks.items():
    in_layers = [p for p in tree if p.startswith(stack + "/")
                 and kinds[p] in ("attention", "lora", "mlp", "adapter")]
    if scan:  # one leaf per parameter, its leading axis the layer
      assert all(P.is_scanned(p) and P.layer_index(p) is None and tree[p].shape[0] == n
                 for p in in_layers)
    elif in_layers:
      assert {P.layer_index(p) for p in in_layers} == set(range(n))
      for i in range(n):  # one way to name layer i's query kernel
        assert P.join(stack, P.layer(i), P.SELF_ATTENTION, P.kernel(P.QUERY)) in tree


@pytest.mark.parametrize("family", FAMILIES)
def test_task_model_paths(family):
  tree = task_tree(family, scalar_mix=True)
  assert all(P.kind(p) for p in tree)
  assert {p.split("/")[0] for p in tree} == {P.BACKBONE, P.HEAD, P.SCALAR_MIX}
  # The backbone is the pretraining tree under BACKBONE (less the LM head).
  backbone = {p.removeprefix(P.BACKBONE + "/"): s for p, s in tree.items()
              if p.startswith(P.BACKBONE + "/")}
  assert backbone.items() <= backbone_tree(family).items()
  assert not any(P.kind(p) in ("head", "scalar_mix") for p in backbone)


@pytest.mark.parametrize("family,extra,scan", ALL_TREES)
def test_regexes_match_exactly_their_kind(family, extra, scan):
  for path in backbone_tree(family, extra, scan):
    kind, leaf = P.kind(path), path.rsplit("/", 1)[1]
    is_bias = leaf == P.BIAS or leaf.endswith("_" + P.BIAS) or kind == "relative_bias"
    assert bool(re.search(P.NORM_RE, path)) == (kind == "norm"), path
    assert bool(re.search(P.BIAS_RE, path)) == is_bias, path
    assert bool(re.search(P.ADAPTER_RE, path)) == (kind == "adapter"), path
    assert bool(re.search(P.LORA_RE, path)) == (kind == "lora"), path
    projection = P.lora_projection(path)
    if projection is not None:  # merge_lora finds B and the kernel beside A
      assert {P.lora_b(projection), P.kernel(projection)} <= set(backbone_tree(
          family, extra, scan))


@pytest.mark.parametrize("family,extra", [(f, e) for f in FAMILIES for e in EXTRAS])
def test_decay_mask_excludes_exactly_norms_and_biases(family, extra):
  tree = task_tree(family, extra, scalar_mix=True)
  decayed = traverse_util.flatten_dict(optim.decay_mask(nested(tree)), sep="/")
  for path in tree:
    kind, leaf = P.kind(path), path.rsplit("/", 1)[1]
    no_decay = (kind in ("norm", "relative_bias") or leaf == P.BIAS
                or leaf.endswith("_" + P.BIAS))
    assert decayed[path] == (not no_decay), path


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_depth_runs_from_embeddings_to_head(family):
  tree, n = task_tree(family, scalar_mix=True), BASE["num_layers"]
  stack = P.join(P.BACKBONE, P.ENCODER if family == "encoder_decoder" else P.STACK)
  under = {0: (P.join(P.BACKBONE, P.TOKEN_EMBED), P.join(stack, P.EMBEDDER),
               P.join(stack, P.RELATIVE_BIAS)),
           **{i + 1: (P.join(stack, P.layer(i)),) for i in range(n)}}
  depths = {p: optim.layer_depth(p, n) for p in tree}
  for path, depth in depths.items():
    expected = next((d for d, prefixes in under.items()
                     if any(path.startswith(prefix + "/") for prefix in prefixes)),
                    n + 1)  # the rest: final norm, task head, scalar mix
    assert depth == expected, path
  assert set(depths.values()) == set(range(n + 2))
  scanned = [p for p in backbone_tree(family, scan=True) if P.is_scanned(p)]
  with pytest.raises(ValueError, match="scan_layers"):
    optim.layer_depth(scanned[0], n)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme,extra,trains", [
    ("full", "plain", None),
    ("features", "plain", {"head"}),
    ("scalar_mix", "plain", {"head", "scalar_mix"}),
    ("adapters", "adapters", {"adapter", "norm", "head"}),
    ("lora", "lora", {"lora", "head"}),
])
def test_schemes_train_exactly_their_parameters(family, scheme, extra, trains):
  tree = task_tree(family, extra, scalar_mix=scheme == "scalar_mix")
  frozen = traverse_util.flatten_dict(
      optim.frozen_mask(nested(tree), SCHEMES[scheme]), sep="/")
  for path in tree:
    assert frozen[path] == (trains is not None and P.kind(path) not in trains), path


@pytest.mark.parametrize("model_type", sorted(hf.FAMILIES))
def test_conversion_tables_name_exactly_the_model_parameters(model_type):
  family = hf.FAMILIES[model_type]
  cfg = family.config_from_hf(family.config_to_hf(config(family.family)))
  args = (TOKENS, TOKENS) if cfg.family == "encoder_decoder" else (TOKENS,)
  tree = flat_params(build_model(cfg), *args)
  named = {r.jax for r in family.rules(cfg)}
  head = {p for p in named if P.kind(p) == "head"}
  assert named - head == set(tree)
  assert all(p.startswith(P.HEAD + "/") for p in head)
