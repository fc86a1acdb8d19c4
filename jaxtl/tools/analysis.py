"""What is in a representation: layer-wise linear probes and attention maps.

``probe`` trains a linear softmax classifier on each layer's frozen states
(mean-pooled per sentence, or the first sub-word of each word for ``pos``)
and writes ``probe.md`` (accuracy by layer) and ``probe.png``. ``attention``
writes one PNG per layer with a heatmap per head.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxtl.pretraining import pretrained
from jaxtl.tasks import features as task_features, readers as tasks
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import build_model
from jaxtl.models.config import input_side
from jaxtl.models.family import family_of
from jaxtl.models.heads import pool


def load_pretrained(init_from: str, compute_dtype: str = "") -> tuple[Any, Any, Tokenizer]:
  """(model, params, tokenizer) of a jaxtl workdir or a Hugging Face folder,
  computing in ``compute_dtype`` ("": as the workdir records)."""
  loaded = pretrained.load(init_from, compute_dtype=compute_dtype)
  return (build_model(loaded.config.replace(dropout_rate=0.0)), loaded.params,
          loaded.tokenizer)


def hidden_states(model: Any, params: Any, tokens: np.ndarray, segment_ids: np.ndarray,
                  batch_size: int = 64) -> list[np.ndarray]:
  """Every layer's states [N, T, D] (embeddings first) for rows of tokens."""
  seq2seq = family_of(model.config).seq2seq

  @jax.jit
  def run(toks, seg):
    if seq2seq:
      _, extras = model.apply({"params": params}, toks, seg, method="encode",
                              return_hidden=True)
      return extras["hidden_states"]
    return model.apply({"params": params}, toks, seg, return_hidden=True,
                       lm_head=False)["hidden_states"]

  chunks = [run(tokens[i:i + batch_size], segment_ids[i:i + batch_size])
            for i in range(0, len(tokens), batch_size)]
  return [np.concatenate([np.asarray(c[layer], np.float32) for c in chunks])
          for layer in range(len(chunks[0]))]


def train_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                y_test: np.ndarray, num_classes: int, steps: int = 300,
                lr: float = 1e-2, l2: float = 1e-4) -> float:
  """Test accuracy of a full-batch softmax regression on standardised features."""
  mean, std = x_train.mean(0), x_train.std(0) + 1e-6
  xs, xt = (x_train - mean) / std, (x_test - mean) / std
  params = {"w": jnp.zeros((xs.shape[1], num_classes)), "b": jnp.zeros(num_classes)}
  tx = optax.adam(lr)

  def loss(p):
    logits = xs @ p["w"] + p["b"]
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), y_train[:, None], 1).mean()
    return nll + l2 * jnp.sum(p["w"] ** 2)

  @jax.jit
  def fit(p):
    def body(carry, _):
      p, s = carry
      g = jax.grad(loss)(p)
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    (p, _), _ = jax.lax.scan(body, (p, tx.init(p)), None, length=steps)
    return p

  p = fit(params)
  return float(np.mean(np.argmax(xt @ p["w"] + p["b"], -1) == y_test))


def _probe_inputs(states: np.ndarray, feats: task_features.Features, tagging: bool,
                  seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  if tagging:
    keep = feats.arrays["label_weights"] > 0
    return states[keep], feats.arrays["labels"][keep]
  return np.asarray(pool(jnp.asarray(states), jnp.asarray(seg), "mean")), feats.arrays["labels"]


def probe_layers(workdir: str, task: str, max_len: int = 64,
                 max_examples: int = 2000, compute_dtype: str = "") -> list[float]:
  """Probe accuracy per layer (index 0: the embeddings) on a task's test split."""
  model, params, tok = load_pretrained(workdir, compute_dtype)
  tagging = task == "pos"
  test_split = "dev" if tagging else tasks.EVAL_SPLITS[task]
  family = model.config.family
  side = input_side(family)
  encode = task_features.encode_tagging if tagging else task_features.encode_sequences
  data, num_classes = {}, 0
  for split in ("train", test_split):
    ex = tasks.load_task(task, split)
    ex = ex.subset(np.random.default_rng(0).permutation(len(ex))[:max_examples])
    num_classes = num_classes or len(ex.label_names)
    f = encode(ex, tok, max_len, family)
    seg = f.arrays[f"{side}_segment_ids"]
    data[split] = (hidden_states(model, params, f.arrays[f"{side}_input_tokens"], seg),
                   f, seg)
  accs = []
  for layer in range(len(data["train"][0])):
    xtr, ytr = _probe_inputs(data["train"][0][layer], data["train"][1], tagging, data["train"][2])
    xte, yte = _probe_inputs(data[test_split][0][layer], data[test_split][1], tagging,
                             data[test_split][2])
    accs.append(train_probe(xtr, ytr, xte, yte, num_classes))
  return accs


def write_probe_report(accs: Sequence[float], task: str, out_dir: str) -> None:
  """probe.md (a table) and probe.png (accuracy vs layer)."""
  # optional (jaxtl[analysis]) and slow to import: only the figure needs it
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  rows = [f"| {'embeddings' if i == 0 else f'layer {i}'} | {100 * a:.1f} |"
          for i, a in enumerate(accs)]
  with open(os.path.join(out_dir, "probe.md"), "w") as f:
    f.write(f"| {task} probe | accuracy (%) |\n| --- | --- |\n" + "\n".join(rows) + "\n")
  fig, ax = plt.subplots(figsize=(5, 3))
  ax.plot(range(len(accs)), [100 * a for a in accs], marker="o")
  ax.set_xlabel("layer (0 = embeddings)")
  ax.set_ylabel("probe accuracy (%)")
  ax.set_title(f"linear probe by layer: {task}")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "probe.png"), dpi=120)
  plt.close(fig)


def attention_maps(workdir: str, text: str, out_dir: str,
                   compute_dtype: str = "") -> list[str]:
  """One PNG per layer: a heatmap per head of who attends to whom in ``text``."""
  # optional (jaxtl[analysis]) and slow to import: only the figure needs it
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  model, params, tok = load_pretrained(workdir, compute_dtype)
  ids = tok.encode(text)[:model.config.max_len]
  toks = jnp.asarray([ids], jnp.int32)
  if family_of(model.config).seq2seq:
    _, extras = model.apply({"params": params}, toks, method="encode",
                            return_attention=True)
  else:
    extras = model.apply({"params": params}, toks, return_attention=True, lm_head=False)
  labels = [tok.decode([i]) or "·" for i in ids]
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for layer, weights in enumerate(extras["attentions"]):
    heads = np.asarray(weights[0])  # [H, T, T]
    fig, axes = plt.subplots(1, len(heads), figsize=(3.2 * len(heads), 3.4),
                             squeeze=False)
    for h, ax in enumerate(axes[0]):
      ax.imshow(heads[h], cmap="viridis", vmin=0.0, vmax=1.0)
      ax.set_title(f"layer {layer + 1}, head {h + 1}", fontsize=8)
      ax.set_xticks(range(len(ids)), labels, rotation=90, fontsize=6)
      ax.set_yticks(range(len(ids)), labels if h == 0 else [], fontsize=6)
    fig.tight_layout()
    path = os.path.join(out_dir, f"attention_layer{layer + 1}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  return paths
