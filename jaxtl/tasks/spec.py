"""What a fine-tuned model is for: the task it was trained on, kept as
``task.json`` in the fine-tuning workdir.

With ``model_config.json`` (the backbone) and ``tokenizer/`` beside it, this
is what makes a fine-tuning workdir a complete model: :func:`task_model`
rebuilds the exact :class:`~jaxtl.models.heads.TaskModel` that was trained,
and the fields tell a predictor how to encode inputs (``max_len``, which
fields are the texts) and how to name outputs (``label_names``). Fine-tuning
builds its model through the same :func:`task_model`, so training and
loading cannot drift apart. Other tools (the Hugging Face task-head export)
read the same file, so its keys are a contract: add keys, never rename.
"""

from __future__ import annotations

import dataclasses
import json
import os

from jaxtl import layout
from jaxtl.data.tokenizers import Tokenizer
from jaxtl.models import TransformerConfig
from jaxtl.models.family import family_of
from jaxtl.models.heads import POOLINGS, TaskModel
from jaxtl.pretraining import pretrained
from jaxtl.tasks import features as task_features
from jaxtl.tasks import kinds
from jaxtl.tasks.config import FILES_TASK, FinetuneConfig, TaskConfig

# The input fields a predictor reads, by kind (and by whether the task has pairs).
_FIELDS = {"single": ("text",), "pair": ("text", "text_pair"),
           "token_classification": ("words",), "span_qa": ("question", "context")}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A fine-tuned model's task: enough to rebuild its head and its inputs.

  Attributes mirror ``config.task`` where they share a name, so a spec can
  stand in for it wherever a task kind reads one (encoding, predictions).

  Attributes:
    name: The task (``trec``, ``sst2``, ...).
    kind: classification | regression | token_classification | span_qa |
      text_to_text | generation.
    label_names: Class (or tag) names by class id; None for regression and
      span_qa.
    pooling: How the head pools the sequence: first, last, mean, concat or
      pooler.
    max_len: Tokens per input (longer inputs are cut as in training).
    family: The backbone's family: encoder, decoder or encoder_decoder.
    scalar_mix: The head reads an ELMo mix of all layers.
    label_words: The texts a text_to_text model writes per class, else None.
    text_fields: The names of the input fields: ``text`` (+ ``text_pair``),
      ``words`` (tagging) or ``question`` + ``context`` (span_qa).
    head_dropout: The head's dropout (training only).
    scheme: The adaptation scheme it was trained with.
    metrics: The metric set the task reports.
    doc_stride: span_qa: tokens between context windows.
    max_answer_tokens: span_qa: the longest answer predicted.
    length_multiple: Batches are cut to their longest row rounded up to this.
    max_target_len: generation: output tokens (with EOS) trained on and written.
    num_beams: generation: beam search width (T5; 1: greedy).
    columns: The columns of the user's files that fed ``text_fields``, in
      order (``task=files``: ``config.task.text_fields``), which ``predict``
      reads by default; empty: the ``text_fields`` names.
    compute_dtype: What fine-tuning was asked to compute in
      (``config.train.compute_dtype``). ``auto`` is decided again by the
      machine that loads the model (:func:`jaxtl.tasks.predictor.load`);
      a dtype, or empty (the backbone's; older workdirs), runs as
      ``model_config.json`` records.
  """
  name: str
  kind: str
  label_names: tuple[str, ...] | None
  pooling: str
  max_len: int
  family: str
  scalar_mix: bool = False
  label_words: tuple[str, ...] | None = None
  text_fields: tuple[str, ...] = ("text",)
  head_dropout: float = 0.1
  scheme: str = "full"
  metrics: str = ""
  doc_stride: int = 128
  max_answer_tokens: int = 30
  length_multiple: int = 16
  max_target_len: int = 32
  num_beams: int = 1
  columns: tuple[str, ...] = ()
  compute_dtype: str = ""

  @property
  def is_pair(self) -> bool:
    """Sentence-pair classification or regression (two texts per input)."""
    return self.text_fields == _FIELDS["pair"]


def label_words(task: TaskConfig, names: tuple[str, ...] | None) -> tuple[str, ...]:
  """What a text-to-text model writes for each class: ``task.label_words``,
  else the label names with underscores as spaces."""
  if not names:
    raise ValueError(f"task.kind=text_to_text needs a classification task; "
                     f"{task.name!r} has no label names")
  words = tuple(task.label_words or ()) or tuple(n.replace("_", " ") for n in names)
  if len(words) != len(names) or len(set(words)) != len(words):
    raise ValueError(f"task.label_words={words} must name each of the {len(names)} "
                     f"labels {names} with a distinct text")
  return words


def from_config(config: FinetuneConfig, family: str, label_names: tuple[str, ...] | None,
                pair: bool) -> TaskSpec:
  """The spec of a fine-tuning config's task on a ``family`` backbone.

  ``label_names`` and ``pair`` come from the training split (the reader
  knows them, the config does not).
  """
  task, scheme = config.task, config.adapt.scheme
  kinds.get(task.kind)  # an unknown kind: its error names the known ones
  if task.kind in ("text_to_text", "generation") and scheme in ("features", "scalar_mix"):
    raise ValueError(f"config.adapt.scheme={scheme!r} trains only a "
                     f"classifier head, and {task.kind} has none (the LM writes "
                     "the text): use full, adapters or lora")
  if task.kind == "generation" and task.num_beams > 1:
    family_of(family).check_beam_search(f"config.task.num_beams={task.num_beams}")
  if task.pooling and task.pooling not in POOLINGS:
    raise ValueError(f"config.task.pooling={task.pooling!r}; known: "
                     f"{', '.join(POOLINGS)} (or empty: the backbone's default)")
  words = label_words(task, label_names) if task.kind == "text_to_text" else None
  if task.kind == "generation":  # the user's names: they prefix the input text
    fields = tuple(task.text_fields)
  else:
    fields = _FIELDS.get(task.kind) or _FIELDS["pair" if pair else "single"]
  return TaskSpec(
      name=task.name, kind=task.kind,
      label_names=tuple(label_names) if label_names else None,
      pooling=task.pooling or family_of(family).default_pooling, max_len=task.max_len,
      family=family, scalar_mix=scheme == "scalar_mix", label_words=words,
      text_fields=fields, head_dropout=task.head_dropout, scheme=scheme,
      metrics=task.metrics, doc_stride=task.doc_stride,
      max_answer_tokens=task.max_answer_tokens,
      length_multiple=config.train.length_multiple,
      max_target_len=task.max_target_len, num_beams=task.num_beams,
      columns=tuple(task.text_fields) if task.name == FILES_TASK else (),
      compute_dtype=config.train.compute_dtype)


def task_model(cfg: TransformerConfig, spec: TaskSpec, tok: Tokenizer) -> TaskModel:
  """The backbone plus the head ``spec`` names: the one way a TaskModel is
  built, for fine-tuning and for loading a fine-tuned workdir alike."""
  targets = ()
  if spec.kind == "text_to_text":
    targets = task_features.label_sequences(spec.label_words, tok)
  return TaskModel(cfg, kind=spec.kind,
                   num_labels=len(spec.label_names) if spec.label_names else 1,
                   pooling=spec.pooling, dropout_rate=spec.head_dropout,
                   scalar_mix=spec.scalar_mix, label_tokens=targets,
                   pad_id=tok.pad_id, eos_id=tok.eos_id)


# What a spec's checkpoints are bound to: its head's shape and meaning. The
# rest (max_len, beams, dropout, ...) may change on a resume.
IDENTITY_FIELDS = ("name", "kind", "label_names", "pooling", "family", "scalar_mix",
                   "label_words", "text_fields", "scheme")


def differences(old: TaskSpec, new: TaskSpec) -> list[str]:
  """``field: old -> new`` for each identity field that differs."""
  return [f"{f}: {getattr(old, f)!r} -> {getattr(new, f)!r}" for f in IDENTITY_FIELDS
          if getattr(old, f) != getattr(new, f)]


def save(spec: TaskSpec, workdir: str) -> str:
  """Writes ``workdir/task.json`` (whole or not at all); returns its path."""
  path = layout.task_file(workdir)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(dataclasses.asdict(spec), f, indent=1)
  os.replace(tmp, path)
  return path


def exists(workdir: str) -> bool:
  """Whether ``workdir`` is a fine-tuning workdir (it has a task.json)."""
  return os.path.isfile(layout.task_file(workdir))


def _not_fine_tuned(workdir: str, path: str) -> str:
  """Why ``workdir`` has no task.json, and what it can do instead."""
  if not os.path.isdir(workdir):
    return f"{workdir}: no such folder"
  if os.path.isfile(layout.model_config_file(workdir)):
    try:
      rules = family_of(pretrained.load_model_config(workdir))
      writes = rules.causal or rules.seq2seq  # a causal LM, a T5 or a BART
    except (OSError, ValueError, TypeError, KeyError):  # the mistake is said: a workdir
      writes = False
    return (f"{workdir} is a pretraining workdir, not a fine-tuned one (no "
            f"{layout.TASK_FILE}): fine-tune it with --config.init_from={workdir}"
            + (f", or write text with it: jaxtl generate --checkpoint={workdir}"
               if writes else ""))
  if os.path.isfile(os.path.join(workdir, "config.json")):
    return (f"{workdir} is a Hugging Face model folder, not a jaxtl fine-tuning "
            f"workdir (no {layout.TASK_FILE}): fine-tune from it with "
            f"--config.init_from={workdir}")
  return (f"{path} not found: not a jaxtl fine-tuning workdir (fine-tuning "
          "writes it before training starts)")


def load(workdir: str) -> TaskSpec:
  """The spec in ``workdir/task.json``; unknown keys (newer writers) are ignored."""
  path = layout.task_file(workdir)
  if not os.path.isfile(path):
    raise FileNotFoundError(_not_fine_tuned(workdir, path))
  try:
    with open(path) as f:
      values = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e
  known = {f.name for f in dataclasses.fields(TaskSpec)}
  missing = [f.name for f in dataclasses.fields(TaskSpec)
             if f.default is dataclasses.MISSING and f.name not in values]
  if missing:
    raise ValueError(f"{path}: missing key(s) {missing}")
  values = {k: tuple(v) if isinstance(v, list) else v
            for k, v in values.items() if k in known}
  return TaskSpec(**values)
