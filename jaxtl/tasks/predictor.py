"""A fine-tuning workdir as a model that predicts: ``jaxtl.load(workdir)``.

The workdir holds all it takes (``model_config.json``, ``tokenizer/``,
``task.json``, ``best/``), so nothing here repeats a training setting by
hand: the model is rebuilt by :func:`jaxtl.tasks.spec.task_model`, inputs are
encoded by the task kind's own ``encode`` (the same truncation as
training), batches are cut to their longest row as in training, and the
outputs are named by the kind's ``present``.

  model = jaxtl.load("workdirs/trec_full")
  model.predict(["Who wrote Hamlet?"])
  # [{"label": "HUM", "probabilities": {"ABBR": 0.01, ...}}]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import jax

from jaxtl.data import tokenizer_files
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig, layers, paths
from jaxtl.models.config import computing_in, input_side
from jaxtl.models.heads import TaskModel
from jaxtl.tasks import finetune, generation, inference, kinds
from jaxtl.tasks import spec as task_spec
from jaxtl.tasks.examples import Examples
from jaxtl.tasks.squad import SquadExample
from jaxtl.train import checkpoint, sharding
from jaxtl.pretraining import pretrained

# One input: a text, a (text, text_pair) or (question, context) pair, a
# word list (tagging), or a mapping from the task's text field names.
Input = str | Sequence[str] | Mapping[str, Any]


@dataclasses.dataclass(repr=False)
class FineTuned:
  """A fine-tuned model, loaded.

  Attributes:
    config: The backbone's architecture (LoRA merged: ``lora_rank=0``).
    spec: The task (``task.json``): label names, max length, input fields.
    tokenizer: The tokenizer it was trained with.
    params: The whole TaskModel tree: ``backbone``, ``head`` (and
      ``scalar_mix``), host arrays from the selected checkpoint.
    model: The TaskModel.
  """
  config: TransformerConfig
  spec: task_spec.TaskSpec
  tokenizer: Tokenizer
  params: dict[str, Any]
  model: TaskModel

  def __repr__(self) -> str:
    """What a notebook shows for ``jaxtl.load(workdir)``: the task and the
    model in a line, not every parameter's numbers."""
    spec, cfg = self.spec, self.config
    labels = list(spec.label_names or ())
    shown = (f", labels={labels[:8]}{'...' if len(labels) > 8 else ''} ({len(labels)})"
             if labels else "")
    size = sum(x.size for x in jax.tree.leaves(self.params))
    return (f"FineTuned(task={spec.name!r}, kind={spec.kind!r}{shown}, "
            f"{cfg.family}: {cfg.num_layers} layers, d_model {cfg.d_model}, "
            f"{size / 1e6:.1f}M parameters, computes in {cfg.dtype})")

  @functools.cached_property
  def _run(self) -> tuple[Callable, Any, Any]:
    """(jitted inference, device params, mesh); compiled once per padded shape."""
    mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    infer = kinds.get(self.spec.kind).infer
    outputs = finetune.model_outputs(self.model, self.spec, self.tokenizer)

    def run(params, batch):
      return infer(outputs(params, batch), batch, self.spec)

    return jax.jit(run), jax.device_put(self.params, jax.devices()[0]), mesh

  def predict(self, inputs: Sequence[Input], batch_size: int = 32,
              desc: str | None = "predict") -> list[dict[str, Any]]:
    """One prediction per input, in order.

    Classification: ``{"label", "probabilities"}`` (text_to_text adds the
    ``text`` the decoder writes); regression: ``{"value"}``; tagging:
    ``{"tags"}``, one per word (None for words past ``max_len``); span_qa:
    ``{"answer"}``; generation: ``{"generated"}``, the text it writes. Inputs: texts, ``(text, text_pair)`` pairs for pair
    tasks, word lists (or whitespace-split texts) for tagging,
    ``(question, context)`` for span_qa, or mappings keyed by
    ``spec.text_fields``. A lone text is one input (a list of one
    prediction), not its characters. ``desc`` names the progress bar shown
    on a terminal for many batches (None: no bar).
    """
    if isinstance(inputs, str):
      inputs = [inputs]
    if not len(inputs):
      return []
    kind = kinds.get(self.spec.kind)
    examples = as_examples(self.spec, inputs)
    feats = kind.encode(examples, self.tokenizer, self.spec, self.config)
    run, params, mesh = self._run
    outputs = inference.predict(run, params, feats.arrays, batch_size, mesh,
                               input_side(self.config.family),
                               self.spec.length_multiple, desc=desc, pack=kind.packs)
    return kind.present(self.spec, outputs, feats, examples)


def load(workdir: str, compute_dtype: str | None = None) -> FineTuned:
  """The model of a fine-tuning workdir: its ``best/`` state (else its
  newest checkpoint), architecture, tokenizer and task.

  ``compute_dtype``: what it computes in here: float32, bfloat16, or auto
  (bfloat16 on a GPU or TPU, bfloat16 with row-major dots on a CPU where
  they pay, float32 on other CPUs). None: what fine-tuning was asked
  (``task.json``), so a model tuned under auto on one machine computes as
  auto picks on the machine that loads it."""
  spec = task_spec.load(workdir)
  cfg = pretrained.load_model_config(workdir)
  tok = tokenizer_files.workdir_tokenizer(workdir)
  pretrained.check_tokenizer(tok, cfg, workdir)
  params = checkpoint.load_selected(workdir)
  if paths.BACKBONE not in params:
    raise ValueError(f"{workdir}: its checkpoint holds no task model (no "
                     f"{paths.BACKBONE!r} parameters)")
  cfg, backbone = layers.without_lora(cfg, params[paths.BACKBONE])
  cfg = computing_in(cfg, spec.compute_dtype if compute_dtype is None else compute_dtype)
  params = {**params, paths.BACKBONE: backbone}
  return FineTuned(cfg, spec, tok, params, task_spec.task_model(cfg, spec, tok))


def _fields(spec: task_spec.TaskSpec, item: Input, index: int) -> tuple[Any, ...]:
  """An input as a tuple of the task's fields; errors name the input's index."""
  names = spec.text_fields
  if isinstance(item, Mapping):
    missing = [n for n in names if n not in item]
    if missing:
      raise ValueError(f"input {index}: missing field(s) {missing} (the task "
                       f"{spec.name!r} reads {list(names)})")
    values = tuple(item[n] for n in names)
  elif isinstance(item, (tuple, list)) and spec.kind != "token_classification":
    values = tuple(item)
  else:  # a text, a tagging input's word list; anything else fails below
    values = (item,)
  if spec.kind == "token_classification":
    words = values[0].split() if isinstance(values[0], str) else values[0]
    if not isinstance(words, (tuple, list)) or not all(isinstance(w, str) for w in words):
      raise ValueError(f"input {index}: tagging takes a text or a list of words, "
                       f"got {item!r:.200}")
    values = (list(words),)
  elif len(values) != len(names) or not all(isinstance(v, str) for v in values):
    raise ValueError(f"input {index}: the task {spec.name!r} takes "
                     f"{len(names)} text(s) {list(names)}, got {item!r:.200}")
  return values


def as_examples(spec: task_spec.TaskSpec, inputs: Sequence[Input]) -> Any:
  """Unlabelled inputs in the container the task kind encodes (dummy labels,
  which prediction never reads)."""
  rows = [_fields(spec, item, i) for i, item in enumerate(inputs)]
  if spec.kind == "span_qa":
    return [SquadExample(id=str(i), title="", context=c, question=q, answers=())
            for i, (q, c) in enumerate(rows)]
  if spec.kind == generation.KIND:
    return generation.unlabelled(spec, rows)
  if spec.kind == "token_classification":
    words = [r[0] for r in rows]
    return Examples(texts=[" ".join(w) for w in words],
                    labels=[[0] * len(w) for w in words],
                    label_names=spec.label_names, words=words)
  zero = 0 if spec.label_names else 0.0  # class ids, or regression scores
  return Examples(texts=[r[0] for r in rows], labels=[zero] * len(rows),
                  label_names=spec.label_names,
                  text_pairs=[r[1] for r in rows] if spec.is_pair else None)
