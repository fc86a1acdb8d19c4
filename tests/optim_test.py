"""Optimizers: clipping, and fine-tuning's freezing, discriminative learning
rates and unfreezing."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxtl.train import optim

OPTIM = optim.OptimConfig(
    lr=1e-2, warmup_steps=0, schedule="constant", end_lr_ratio=1.0,
    weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, clip_norm=0.0, accum_steps=1)
PARAMS = {
    "backbone": {"token_embed": {"embedding": jnp.ones((4, 2))},
                 "stack": {"layer_0": {"mlp": {"kernel": jnp.ones((2, 2))}},
                           "layer_1": {"mlp": {"kernel": jnp.ones((2, 2))}},
                           "final_norm": {"scale": jnp.ones(2)}}},
    "head": {"out": {"kernel": jnp.ones((2, 3))}},
}
GRADS = jax.tree.map(jnp.ones_like, PARAMS)


def run(steps, **kw):
  tx, _ = optim.make_finetune_optimizer(OPTIM, 10, PARAMS, num_layers=2, **kw)
  state, params, history = tx.init(PARAMS), PARAMS, []
  for _ in range(steps):
    updates, state = tx.update(GRADS, state, params)
    params = optax.apply_updates(params, updates)
    history.append(params)
  return state, history


@pytest.mark.parametrize("scale", [0.1, 10.0])  # under the limit, and over it
@pytest.mark.parametrize("given_norm", [False, True])
def test_clipping_matches_optax_with_the_same_state(scale, given_norm):
  grads = jax.tree.map(lambda x: x * scale, {"a": jnp.arange(6.0).reshape(2, 3),
                                             "b": -jnp.ones(4)})
  ours, theirs = optim.clip_by_global_norm(2.0), optax.clip_by_global_norm(2.0)
  state = ours.init(grads)
  assert jax.tree.structure(state) == jax.tree.structure(theirs.init(grads))
  extra = {"grad_norm": optax.tree.norm(grads)} if given_norm else {}
  got, _ = jax.jit(lambda g: ours.update(g, state, **extra))(grads)
  want, _ = theirs.update(grads, theirs.init(grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)
  assert float(optax.tree.norm(got)) <= 2.0 * (1 + 1e-6)


def test_the_train_steps_norm_reaches_the_clipping_inside_a_chain():
  # train_step passes its gradient norm as an extra argument: a chain hands
  # it to the clipping and past every transform that takes no such argument.
  tx = optax.chain(optim.clip_by_global_norm(1.0), optax.sgd(1.0))
  updates, _ = tx.update(GRADS, tx.init(PARAMS), PARAMS, grad_norm=jnp.asarray(4.0))
  np.testing.assert_allclose(updates["head"]["out"]["kernel"], -0.25)


def optax_schedule(c, total):
  """The schedule as optax composes it, the reference for optim.Schedule."""
  warmup = c.warmup_steps or round(c.warmup_fraction * total)
  end, decay_steps = c.lr * c.end_lr_ratio, max(total - warmup, 1)
  decay = {"cosine": optax.cosine_decay_schedule(c.lr, decay_steps, alpha=c.end_lr_ratio),
           "linear": optax.linear_schedule(c.lr, end, decay_steps),
           "stlr": optax.linear_schedule(c.lr, end, decay_steps),
           "constant": optax.constant_schedule(c.lr)}[c.schedule]
  warm = optax.linear_schedule(end if c.schedule == "stlr" else 0.0, c.lr, max(warmup, 1))
  return optax.join_schedules([warm, decay], [warmup]) if warmup else decay


@pytest.mark.parametrize("kind", optim.SCHEDULES)
@pytest.mark.parametrize("warmup", [0, 7])
def test_schedules_give_optaxs_values(kind, warmup):
  c = dataclasses.replace(OPTIM, schedule=kind, lr=3e-4, warmup_steps=warmup,
                          end_lr_ratio=0.05)
  ours, theirs = optim.make_schedule(c, 50), optax_schedule(c, 50)
  steps = np.arange(60)
  np.testing.assert_allclose(jax.jit(jax.vmap(ours))(steps),
                             [float(theirs(int(t))) for t in steps], rtol=2e-6, atol=1e-12)


def test_adamw_matches_optax_with_the_same_state():
  """Each step's update is optax.adamw's, given the schedule as an argument
  or not; the state has optax's structure, so older checkpoints load."""
  c = dataclasses.replace(OPTIM, schedule="cosine", warmup_steps=2, weight_decay=0.1)
  schedule = optim.make_schedule(c, 10)
  ours = optim.adamw(c, schedule)
  theirs = optax.adamw(optax_schedule(c, 10), b1=c.b1, b2=c.b2, eps=c.eps,
                       weight_decay=c.weight_decay, mask=optim.decay_mask)
  state, want_state = ours.init(PARAMS), theirs.init(PARAMS)
  assert jax.tree.structure(state) == jax.tree.structure(want_state)
  update = jax.jit(lambda g, s, p, sched: ours.update(g, s, p, schedule=sched))
  for i in range(4):
    grads = jax.tree.map(lambda x: x * (i + 1), GRADS)
    alone, _ = ours.update(grads, state, PARAMS)  # the schedule it was built with
    got, state = update(grads, state, PARAMS, schedule)
    want, want_state = theirs.update(grads, want_state, PARAMS)
    for a, b, d in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(alone)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-10)
      np.testing.assert_allclose(d, a, rtol=1e-5, atol=1e-10)


def moved(before, after):
  return jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                      before, after)


def test_layer_depths():
  depth = lambda n: optim.layer_depth(n, 2)
  assert depth("backbone/token_embed/embedding") == 0
  assert depth("backbone/stack/layer_0/mlp/kernel") == 1
  assert depth("backbone/stack/layer_1/mlp/kernel") == 2
  assert depth("head/out/kernel") == 3 and depth("backbone/stack/final_norm/scale") == 3
  with pytest.raises(ValueError, match="scan_layers"):
    depth("backbone/stack/layers/mlp/kernel")


def test_frozen_params_stay_bit_identical_and_have_no_state():
  state, history = run(3, freeze=[r"^backbone/"])
  m = moved(PARAMS, history[-1])
  assert not any(jax.tree.leaves(m["backbone"])) and all(jax.tree.leaves(m["head"]))
  # Adam moments exist only for the head: 6 numbers, not the backbone's 18 too.
  sizes = sum(x.size for x in jax.tree.leaves(state) if hasattr(x, "size") and x.ndim)
  assert sizes == 2 * 6
  assert optim.count_trainable(PARAMS, [r"^backbone/"]) == (6, 24)


def test_discriminative_learning_rates_decay_with_depth():
  _, history = run(1, layer_decay=0.5)
  head = 1 - float(history[0]["head"]["out"]["kernel"][0, 0])
  l1 = 1 - float(history[0]["backbone"]["stack"]["layer_1"]["mlp"]["kernel"][0, 0])
  l0 = 1 - float(history[0]["backbone"]["stack"]["layer_0"]["mlp"]["kernel"][0, 0])
  emb = 1 - float(history[0]["backbone"]["token_embed"]["embedding"][0, 0])
  np.testing.assert_allclose([l1 / head, l0 / head, emb / head], [0.5, 0.25, 0.125],
                             rtol=1e-4)


def test_gradual_unfreezing_goes_top_down():
  _, history = run(6, unfreeze_every=2)
  def trained(i):
    m = moved(PARAMS, history[i])
    return (m["head"]["out"]["kernel"],
            m["backbone"]["stack"]["layer_1"]["mlp"]["kernel"],
            m["backbone"]["stack"]["layer_0"]["mlp"]["kernel"],
            m["backbone"]["token_embed"]["embedding"])
  assert trained(0) == (True, False, False, False)   # steps 0-1: head only
  assert trained(2) == (True, True, False, False)    # steps 2-3: + layer 1
  assert trained(4) == (True, True, True, False)     # steps 4-5: + layer 0
  _, longer = run(7, unfreeze_every=2)
  assert moved(PARAMS, longer[6])["backbone"]["token_embed"]["embedding"]


def test_one_compiled_update_serves_every_budget_and_rate():
  """ULMFiT's unfreezing pace is an input like the rate: runs on other
  budgets (another pace, another length) or rates compile the same update."""
  programs = []
  for total, every, lr in ((10, 2, 1e-2), (400, 37, 3e-4)):
    c = dataclasses.replace(OPTIM, lr=lr, schedule="stlr", warmup_fraction=0.1)
    tx, schedule = optim.make_finetune_optimizer(c, total, PARAMS, num_layers=2,
                                                 layer_decay=0.8, unfreeze_every=every)
    update = jax.jit(lambda g, s, p, k, tx=tx: tx.update(g, s, p, schedule=k))
    programs.append(update.lower(GRADS, tx.init(PARAMS), PARAMS, schedule).as_text())
  assert programs[0] == programs[1]


def test_stlr_is_the_papers_slanted_triangle():
  c = dataclasses.replace(OPTIM, schedule="stlr", lr=0.01, warmup_fraction=0.1,
                          end_lr_ratio=1 / 32)
  lr = optim.make_schedule(c, 100)
  # Howard & Ruder eq. 3, T=100, cut_frac=0.1, ratio=32, lr_max=0.01.
  cut = 10
  def paper(t):
    p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / 0.1 - 1))
    return 0.01 * (1 + p * 31) / 32
  np.testing.assert_allclose([lr(t) for t in (0, 5, 10, 55, 100)],
                             [paper(t) for t in (0, 5, 10, 55, 100)], rtol=1e-5)
  with pytest.raises(ValueError, match="config.optim.schedule='slanted'"):
    optim.make_schedule(dataclasses.replace(c, schedule="slanted"), 10)


def test_a_resumed_rate_that_moved_says_why():
  """The loop's resume check (jaxtl.train.loop.schedule_moved): silent when
  the rate at the resumed step is the saved one, or when the checkpoint is
  older than the check; else it names the cause."""
  from jaxtl.train import loop  # pylint: disable=g-import-not-at-top
  short, longer = optax.linear_schedule(1.0, 0.0, 100), optax.linear_schedule(1.0, 0.0, 200)
  saved = {"steps": 100, "lr": float(short(50))}
  assert loop.schedule_moved(saved, 100, short, 50) is None
  assert loop.schedule_moved({"steps": 100}, 200, longer, 50) is None
  assert "the run now has 200 steps, not the 100" in loop.schedule_moved(saved, 200, longer, 50)
  assert loop.schedule_moved(saved, 100, optax.linear_schedule(2.0, 0.0, 100), 50).endswith(
      "the learning-rate settings changed (config.optim)")


def test_frozen_parameters_cost_no_gradient_and_stay_out_of_the_norm():
  params = {"backbone": {"w": jnp.full((3, 3), 0.5)}, "head": {"w": jnp.full((3, 2), 0.3)}}
  x = jnp.arange(12.0).reshape(4, 3)

  def loss_fn(p, x):
    return jnp.sum(jnp.tanh(x @ p["backbone"]["w"]) @ p["head"]["w"])

  frozen_fn = optim.frozen_without_gradients(loss_fn, params, [r"^backbone/"])
  full, part = jax.grad(loss_fn)(params, x), jax.grad(frozen_fn)(params, x)
  np.testing.assert_array_equal(part["head"]["w"], full["head"]["w"])
  np.testing.assert_array_equal(part["backbone"]["w"], 0)  # so the global norm is the head's
  assert float(optax.tree.norm(part)) == pytest.approx(float(jnp.linalg.norm(full["head"]["w"])))
  # The backbone's weight gradient (and the input gradient it needs) is not computed.
  dots = lambda f: str(jax.make_jaxpr(jax.grad(f))(params, x)).count("dot_general")
  assert dots(frozen_fn) == dots(loss_fn) - 2
  assert optim.frozen_without_gradients(loss_fn, params, []) is loss_fn
