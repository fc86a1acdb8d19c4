"""A jaxtl fine-tuned model in PyTorch: a stock ``transformers`` backbone and
jaxtl's task head.

jaxtl's export (``jaxtl convert``) writes this file beside
``config.json`` when no stock class computes what the fine-tuned model does
(a mean, last, first or concat pooling, an ELMo scalar mix of all layers,
Houlsby adapters, an encoder-decoder's encoder under a classifier).
``config.json``'s ``auto_map`` names the class to load, and its
``jaxtl_head`` what the head computes::

  from transformers import AutoModelForSequenceClassification, pipeline
  model = AutoModelForSequenceClassification.from_pretrained(folder,
                                                             trust_remote_code=True)
  pipeline("text-classification", model=folder, trust_remote_code=True)

The file needs torch and transformers only. The backbone is the stock class
named by ``BACKBONE`` (the tensors keep its names under ``backbone.``); the
head is pooling, an optional pooler (dense + tanh), dropout and a linear
layer, as in ``jaxtl.models.heads``. Adapters run on the output of each
sublayer's last projection, before its dropout and residual, through forward
hooks, so the stock modules and their tensor names stay as they are.
"""

import importlib
import inspect

import torch
import transformers
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (QuestionAnsweringModelOutput,
                                           SequenceClassifierOutput, TokenClassifierOutput)

# The stock class under the head (an LM for JaxtlAdaptedLM); jaxtl sets it per export.
BACKBONE = "BertModel"


def _stock_class(name):
  """A class of transformers by name, or by dotted path for one not exported
  at its top level (BART's encoder)."""
  module, _, attr = name.rpartition(".")
  return getattr(importlib.import_module(module) if module else transformers, attr)


Backbone = _stock_class(BACKBONE)


class Adapter(nn.Module):
  """Houlsby adapter: x + up(act(down(x)))."""

  def __init__(self, width, bottleneck, activation):
    super().__init__()
    self.down = nn.Linear(width, bottleneck)
    self.up = nn.Linear(bottleneck, width)
    self.act = ACT2FN[activation]

  def forward(self, x):
    return x + self.up(self.act(self.down(x)))


def add_adapters(model, head):
  """Runs an adapter on the output of each module ``head["adapters"]["sites"]``
  names (by path inside ``model``), held in ``model.adapters`` in that order."""
  spec = head.get("adapters")
  if not spec:
    return
  width = model.config.hidden_size
  model.adapters = nn.ModuleList(Adapter(width, spec["dim"], spec["activation"])
                                 for _ in spec["sites"])
  modules = dict(model.named_modules())
  for site, adapter in zip(spec["sites"], model.adapters):
    modules[site].register_forward_hook(lambda _, __, out, a=adapter: a(out))


class ScalarMix(nn.Module):
  """ELMo's softmax-weighted sum of every layer's states (each standardised
  over its features first), times gamma."""

  def __init__(self, layers):
    super().__init__()
    self.weights = nn.Parameter(torch.zeros(layers))
    self.gamma = nn.Parameter(torch.ones(1))

  def forward(self, states):
    stacked = torch.stack([nn.functional.layer_norm(s, s.shape[-1:], eps=1e-6)
                           for s in states])
    return self.gamma * torch.einsum("l,lbtd->btd", self.weights.softmax(0), stacked)


def pool(hidden, mask, method):
  """One vector per row from its non-padding tokens (``mask`` 1), as jaxtl's
  ``jaxtl.models.heads.pool``: first, last, mean, or concat ([last, max, mean])."""
  mask = mask.to(hidden.dtype)
  if method == "first":
    return hidden[:, 0]
  if method == "last":
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
  if method == "mean":
    return (hidden * mask[..., None]).sum(1) / mask.sum(1).clamp(min=1)[:, None]
  if method == "concat":
    low = torch.finfo(hidden.dtype).min
    top = hidden.masked_fill(mask[..., None] == 0, low).max(1).values
    top = torch.where(mask.sum(-1, keepdim=True) > 0, top, torch.zeros_like(top))
    return torch.cat([pool(hidden, mask, "last"), top, pool(hidden, mask, "mean")], -1)
  raise ValueError(f"unknown pooling {method!r}")


class JaxtlConfig(Backbone.config_class):
  """The backbone's config under jaxtl's model type, so that only this
  file's classes load the folder (not the stock class with a random head)."""
  model_type = "jaxtl"


class JaxtlPreTrainedModel(transformers.PreTrainedModel):
  """jaxtl's config class; the backbone's tensors under ``backbone.``."""
  config_class = JaxtlConfig
  base_model_prefix = "backbone"

  def _init_weights(self, module):
    """A new head as jaxtl starts one (a model built from its config alone;
    from_pretrained then loads every tensor over it)."""
    if isinstance(module, nn.Linear):
      module.weight.data.normal_(0.0, getattr(self.config, "initializer_range", 0.02))
      module.bias.data.zero_()
    elif isinstance(module, ScalarMix):
      module.weights.data.zero_()
      module.gamma.data.fill_(1.0)


class JaxtlModel(JaxtlPreTrainedModel):
  """The backbone, the states the head reads (a scalar mix of every layer's,
  or the last layer's) and the head's layers; subclasses give the outputs."""
  outputs = 0  # the classifier's width; 0: one per label

  def __init__(self, config):
    super().__init__(config)
    head = config.jaxtl_head
    self.head = head
    extra = {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(
        Backbone.__init__).parameters else {}
    self.backbone = Backbone(config, **extra)
    width = config.hidden_size
    self.scalar_mix = ScalarMix(head["scalar_mix"]) if head.get("scalar_mix") else None
    self.pooler = nn.Linear(width, width) if head.get("pooling") == "pooler" else None
    self.dropout = nn.Dropout(head.get("dropout", 0.1))
    pooled = 3 * width if head.get("pooling") == "concat" else width
    self.classifier = nn.Linear(pooled, self.outputs or config.num_labels)
    add_adapters(self, head)
    self.post_init()

  def states(self, input_ids, attention_mask, token_type_ids, kwargs):
    """(the states the head reads [B, T, D], the backbone's outputs)."""
    if self.head.get("token_types") and token_type_ids is not None:
      kwargs["token_type_ids"] = token_type_ids
    if self.scalar_mix is not None:
      kwargs["output_hidden_states"] = True
    out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    if self.scalar_mix is not None:
      return self.scalar_mix(out.hidden_states), out
    return out.last_hidden_state, out

  def logits(self, hidden):
    return self.classifier(self.dropout(hidden))


class JaxtlForSequenceClassification(JaxtlModel):
  """classification (softmax over ``id2label``) or regression (one score)."""

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
              labels=None, **kwargs):
    hidden, out = self.states(input_ids, attention_mask, token_type_ids, kwargs)
    if attention_mask is None:
      attention_mask = torch.ones(hidden.shape[:2], device=hidden.device)
    pooled = pool(hidden, attention_mask,
                  "first" if self.pooler is not None else self.head["pooling"])
    if self.pooler is not None:
      pooled = torch.tanh(self.pooler(pooled))
    logits = self.logits(pooled)
    loss = None
    if labels is not None and self.config.num_labels == 1:
      loss = nn.functional.mse_loss(logits[:, 0], labels.to(logits.dtype))
    elif labels is not None:
      loss = nn.functional.cross_entropy(logits, labels.view(-1))
    return SequenceClassifierOutput(loss=loss, logits=logits,
                                    hidden_states=out.hidden_states,
                                    attentions=out.attentions)


class JaxtlForTokenClassification(JaxtlModel):
  """One label per token."""

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
              labels=None, **kwargs):
    hidden, out = self.states(input_ids, attention_mask, token_type_ids, kwargs)
    logits = self.logits(hidden)
    loss = None
    if labels is not None:
      loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                 attentions=out.attentions)


class JaxtlForQuestionAnswering(JaxtlModel):
  """Extractive QA: a start and an end logit per token."""
  outputs = 2

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
              start_positions=None, end_positions=None, **kwargs):
    hidden, out = self.states(input_ids, attention_mask, token_type_ids, kwargs)
    start, end = self.logits(hidden).unbind(-1)
    loss = None
    if start_positions is not None and end_positions is not None:
      t = start.shape[1]
      loss = (nn.functional.cross_entropy(start, start_positions.clamp(0, t), ignore_index=t)
              + nn.functional.cross_entropy(end, end_positions.clamp(0, t),
                                            ignore_index=t)) / 2
    return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end,
                                        hidden_states=out.hidden_states,
                                        attentions=out.attentions)


class JaxtlAdaptedLM(Backbone):
  """The stock LM (``BACKBONE``: GPT2LMHeadModel, T5ForConditionalGeneration...)
  with adapters; ``generate`` works as the stock class's."""
  config_class = JaxtlConfig

  def __init__(self, config):
    super().__init__(config)
    add_adapters(self, config.jaxtl_head)
