"""What each Hugging Face model family must tell the converter."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

from jaxtl.convert.rules import Rule
from jaxtl.models.config import TransformerConfig

# HF activation names -> jaxtl's (HF "gelu" is exact, "gelu_new" the tanh form).
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new",
                "gelu_fast": "gelu_new", "relu": "relu", "silu": "silu", "swish": "silu"}


@dataclasses.dataclass(frozen=True)
class Family:
  """A model type's config mapping, tensor rules and checkpoint layout.

  Attributes:
    model_type: ``config.json``'s ``model_type``.
    family: The jaxtl family it maps to.
    config_from_hf / config_to_hf: Between ``config.json`` and TransformerConfig.
    rules: The tensor table for a config (names without ``base_prefix``).
    base_prefix: Task architectures keep the base model under this prefix
      (``bert.``, ``transformer.``); the base model class has none.
    base_architecture: The base model class, whose names have no prefix.
    prefixes: Classes that keep the base model under another prefix than
      ``base_prefix`` (T5ForTokenClassification's ``transformer.``).
    base_groups: Rule groups that live inside the base model.
    architectures: Exportable class names -> the rule groups they hold; the
      first one holding the most of the available groups is the default.
    tied: Tensor names that are copies of another (tied weights): checked
      equal on import, left out on export (``transformers`` re-ties them).
    ignored: Regexes of tensors that are not parameters (buffers) or that
      this config has no place for (BERT's next-sentence head when
      ``sentence_classes`` is 0); dropped on import unless a rule claims them.
    tasks: A fine-tuned model's class per jaxtl task kind
      (:data:`jaxtl.tasks.kinds.REGISTRY`); kinds not listed have no
      Hugging Face class computing what jaxtl's head computes.
    sequence_pooling: The jaxtl pooling that this family's stock sequence
      classifier computes (a model fine-tuned with another one exports with
      jaxtl's head class, :mod:`jaxtl.convert.remote_code`).
    head_transforms: Per class, a function ``(params, head) -> (params,
      head)`` that rewrites parameters into the class's form before export
      (GPT-2's bias-free ``score``); it must keep the class's outputs equal.
    head_shapes: ``config -> {path: shape}`` of head parameters beyond the
      pooler and classifier (ELECTRA's ``head/discriminator_head``).
    special_ids: ``(config, ids) -> config.json fields`` naming the
      tokenizer's special ids (T5's, BART's, GPT-2's); None where the class fixes
      them (RoBERTa's pad 1, which its positions count from) or jaxtl
      writes none.
    head_backbone: The stock class under a task head that only jaxtl's
      modeling file computes (:mod:`jaxtl.convert.remote_code`); default
      ``base_architecture``. An encoder-decoder's task heads read its encoder
      alone (``T5EncoderModel``); a dotted path names a class that
      ``transformers`` does not export at its top level.
    head_backbone_names: ``(old, new)`` name prefixes that turn the ``base``
      group's tensor names into ``head_backbone``'s, where they differ
      (BART's encoder holds the shared table as ``embed_tokens``).
    exported_unasked: Whether an export may pick this family by itself
      (RoBERTa: no; a jaxtl encoder is BERT-like unless RoBERTa is asked for,
      since RoBERTa's checkpoints pair with its own byte-level tokenizer).
  """
  model_type: str
  family: str
  config_from_hf: Callable[[dict[str, Any]], TransformerConfig]
  config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
  rules: Callable[[TransformerConfig], list[Rule]]
  base_prefix: str
  base_architecture: str
  base_groups: tuple[str, ...]
  architectures: dict[str, tuple[str, ...]]
  prefixes: dict[str, str] = dataclasses.field(default_factory=dict)
  tied: dict[str, str] = dataclasses.field(default_factory=dict)
  exported_unasked: bool = True
  ignored: tuple[str, ...] = ()
  tasks: dict[str, str] = dataclasses.field(default_factory=dict)
  sequence_pooling: str = ""
  head_transforms: dict[str, Callable[[Any, Any], tuple[Any, Any]]] = dataclasses.field(
      default_factory=dict)
  head_shapes: Callable[[TransformerConfig], dict[str, tuple[int, ...]]] | None = None
  special_ids: Callable[[TransformerConfig, SpecialIds], dict[str, Any]] | None = None
  head_backbone: str = ""
  head_backbone_names: tuple[tuple[str, str], ...] = ()

  def prefix(self, architecture: str) -> str:
    """Where ``architecture``'s checkpoints keep the base model's tensors."""
    if architecture in self.prefixes:
      return self.prefixes[architecture]
    return "" if architecture == self.base_architecture else self.base_prefix


def get(hf: dict[str, Any], key: str) -> Any:
  """A required ``config.json`` field, with an error that names it."""
  if key not in hf:
    raise ValueError(f"config.json has no {key!r} (model_type "
                     f"{hf.get('model_type')!r}); it is required")
  return hf[key]


def activation_from_hf(name: str) -> str:
  if name not in _ACTIVATIONS:
    raise ValueError(f"activation {name!r} is not supported; known: {sorted(_ACTIVATIONS)}")
  return _ACTIVATIONS[name]


def decoder_start_from_hf(hf: dict[str, Any]) -> str:
  """``config.json``'s ``decoder_start_token_id`` as jaxtl's
  :attr:`TransformerConfig.decoder_start`: the pad id (T5) or the EOS id
  (BART). jaxtl records the role, not the id, since the ids belong to the
  tokenizer."""
  start = hf.get("decoder_start_token_id")
  if start is None or start == hf.get("pad_token_id"):
    return "pad"
  if start == hf.get("eos_token_id"):
    return "eos"
  raise ValueError(f"config.json has decoder_start_token_id={start}, neither its "
                   f"pad_token_id ({hf.get('pad_token_id')}) nor its eos_token_id "
                   f"({hf.get('eos_token_id')}); jaxtl's decoders start from one of them")


class TaskHead(Protocol):
  """What an export reads of a fine-tuned task. :class:`jaxtl.tasks.spec.TaskSpec`
  is one; convert sits below the tasks in the layers, so it names the fields
  it needs rather than the class."""

  @property
  def kind(self) -> str: ...

  @property
  def label_names(self) -> tuple[str, ...] | None: ...

  @property
  def pooling(self) -> str: ...

  @property
  def scalar_mix(self) -> bool: ...

  @property
  def head_dropout(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The special token ids a tokenizer gives a model, which its ``config.json``
  names (``pad_token_id``...). jaxtl keeps them with the tokenizer, not in
  :class:`TransformerConfig` (which records only roles, such as
  ``decoder_start``), so an export takes them from the model's tokenizer or,
  for a round trip, from the ``config.json`` it was imported from."""
  pad: int | None
  eos: int | None
  bos: int | None = None

  @classmethod
  def of(cls, tokenizer: Any) -> "SpecialIds":
    """A jaxtl :class:`jaxtl.data.tokenizers.Tokenizer`'s ids."""
    return cls(tokenizer.pad_id, tokenizer.eos_id, getattr(tokenizer, "bos_id", None))

  @classmethod
  def from_hf(cls, hf: dict[str, Any]) -> "SpecialIds":
    """The ids a ``config.json`` names."""
    return cls(hf.get("pad_token_id"), hf.get("eos_token_id"), hf.get("bos_token_id"))


# jaxtl's SentencePiece tokenizers' ids (and T5's): what an export writes when
# it is given no tokenizer.
JAXTL_IDS = SpecialIds(pad=0, eos=1)


def special_ids_to_hf(cfg: TransformerConfig, ids: SpecialIds = JAXTL_IDS
                      ) -> dict[str, int]:
  """The special ids an exported encoder-decoder's ``config.json`` names: the
  tokenizer's pad and EOS, and the decoder's start among them."""
  if ids.pad is None or ids.eos is None:
    raise ValueError(f"an encoder-decoder's config.json names its pad and EOS ids; "
                     f"the tokenizer gives {ids}")
  return {"pad_token_id": ids.pad, "eos_token_id": ids.eos,
          "decoder_start_token_id": cfg.decoder_start_id(ids.pad, ids.eos)}
