"""EleutherAI's evaluation harness (``pip install 'jaxtl[eval]'``) on any
jaxtl causal or encoder-decoder model.

  jaxtl lm_eval --model_args=checkpoint=workdirs/clm,max_length=64 \
    --tasks=my_task --include_path=my_tasks/ --batch_size=32

``jaxtl lm_eval`` (:mod:`jaxtl.programs.lm_eval`) is lm-eval's own command
line with the model ``jaxtl`` registered; from
Python, import this module before ``lm_eval.simple_evaluate(model="jaxtl",
...)``, or pass it a :class:`JaxtlLM`. ``checkpoint`` is a jaxtl
workdir or a Hugging Face GPT-2 / T5 folder, loaded as
:func:`jaxtl.pretraining.pretrained.load` does.

The harness asks three things, each answered by jaxtl's own code:
``loglikelihood`` (multiple-choice tasks) and ``loglikelihood_rolling``
(perplexity, in windows of ``max_length``) by
:func:`jaxtl.eval.scoring.loglikelihoods`, and ``generate_until`` by
:func:`jaxtl.decoding.generate.generate` (greedy, or sampling when a task asks),
cut at the task's stop strings. Tokenization (where a continuation's word
boundary goes, the empty-context prefix) follows the harness's
``TemplateLM``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from jaxtl.decoding import generate as generate_lib
from jaxtl.eval import scoring
from jaxtl.models.family import family_of
from jaxtl.pretraining import pretrained

NAME = "jaxtl"  # --model of lm_eval


@register_model(NAME)
class JaxtlLM(TemplateLM):
  """A jaxtl model behind the harness's ``LM`` interface.

  Args:
    checkpoint: A jaxtl workdir or a Hugging Face model folder.
    tokenizer: Overrides the model's own tokenizer.
    batch_size: Rows per forward pass (and per generation batch).
    max_length: Tokens the model reads (default: the model's ``max_len``);
      give the length it was trained on when shorter.
    max_gen_toks: New tokens per generation unless a task says otherwise.
    dtype: What the model computes in (the harness's name for it): auto,
      float32 or bfloat16; "" as the workdir records
      (:func:`jaxtl.models.config.computing_in`).
    loaded: An already loaded :class:`jaxtl.pretraining.pretrained.Pretrained`
      (instead of ``checkpoint``).
  """

  def __init__(self, checkpoint: str = "", tokenizer: str = "", batch_size: Any = 16,
               max_length: Any = 0, max_gen_toks: Any = 256, dtype: str = "",
               loaded: Any = None, **unused: Any):
    super().__init__()
    del unused  # the harness's device / max_batch_size: jax places arrays itself
    if loaded is None:
      if not checkpoint:
        raise ValueError("lm_eval --model jaxtl needs --model_args checkpoint=PATH")
      loaded = pretrained.load(checkpoint, tokenizer, dtype)
    family = family_of(loaded.config)
    family.check_generates("lm_eval --model jaxtl")
    self.loaded, self.tok = loaded, loaded.tokenizer
    self.backend = "seq2seq" if family.seq2seq else "causal"
    self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16  # "auto"
    self.max_length = min(int(max_length) or loaded.config.max_len, loaded.config.max_len)
    self.max_gen_toks = int(max_gen_toks)

  @property
  def eot_token_id(self) -> int:
    return self.tok.eos_id

  @property
  def prefix_token_id(self) -> int:
    return self.tok.bos_id if self.tok.bos_id is not None else self.tok.eos_id

  @property
  def tokenizer_name(self) -> str:
    return getattr(self.tok, "source", type(self.tok).__name__)

  def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                 **kwargs: Any) -> list[int]:
    """Ids of ``string``; an encoder-decoder's input ends with EOS, as T5
    was trained (``add_special_tokens=False`` leaves it out)."""
    del kwargs
    ids = self.tok.encode(string)
    if self.backend == "seq2seq" and add_special_tokens is not False:
      ids.append(self.tok.eos_id)
    return ids

  def _scores(self, pairs: list[tuple[list[int], list[int]]]
              ) -> tuple[np.ndarray, np.ndarray]:
    return scoring.loglikelihoods(self.loaded.config, self.loaded.params, pairs,
                                  batch_size=self.batch_size, max_len=self.max_length,
                                  pad_id=self.tok.pad_id, eos_id=self.tok.eos_id)

  def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                            disable_tqdm: bool = False, **kwargs: Any
                            ) -> list[tuple[float, bool]]:
    del disable_tqdm, kwargs
    scored = [i for i, (_, _, cont) in enumerate(requests) if cont]
    out = [(0.0, True)] * len(requests)  # an empty continuation: log 1, trivially greedy
    if scored:
      logp, greedy = self._scores([(list(requests[i][1]), list(requests[i][2]))
                                   for i in scored])
      for j, i in enumerate(scored):
        out[i] = (float(logp[j]), bool(greedy[j]))
        self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
    return out

  def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                            ) -> list[float]:
    """Each text's log-likelihood after the prefix token, in disjoint windows
    of ``max_length`` predictions (each with as much context as fits)."""
    del disable_tqdm
    pairs, owner = [], []
    for i, (string,) in enumerate(req.args for req in requests):
      windows = get_rolling_token_windows(self.tok_encode(string, False),
                                          self.prefix_token_id, self.max_length, 1)
      for context, continuation in map(make_disjoint_window, windows):
        pairs.append((context, continuation))
        owner.append(i)
    totals = np.zeros(len(requests))
    if pairs:
      np.add.at(totals, owner, self._scores(pairs)[0])
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, float(total))
    return totals.tolist()

  def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
    """Greedy (or sampled) continuations, cut before the first stop string."""
    del disable_tqdm
    out: list[str] = [""] * len(requests)
    groups: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
      groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
    for indices in groups.values():
      kwargs = dict(requests[indices[0]].args[1])
      until = kwargs.get("until") or []
      until = [until] if isinstance(until, str) else list(until)
      gen = self._generation_config(kwargs)
      for start in range(0, len(indices), self.batch_size):
        chunk = indices[start:start + self.batch_size]
        texts = self._generate([requests[i].args[0] for i in chunk], gen)
        for i, text in zip(chunk, texts):
          for stop in until:
            text = text.split(stop)[0] if stop else text
          out[i] = text
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return out

  def _generation_config(self, kwargs: dict[str, Any]) -> generate_lib.GenerationConfig:
    n = int(kwargs.get("max_gen_toks", self.max_gen_toks))
    if self.backend == "causal":
      n = min(n, self.max_length - 1)  # room for one token of context at least
    sample = bool(kwargs.get("do_sample", False))
    return generate_lib.GenerationConfig(
        max_new_tokens=n, temperature=float(kwargs.get("temperature", 1.0)) if sample else 0.0,
        top_k=int(kwargs.get("top_k") or 0), top_p=float(kwargs.get("top_p") or 1.0),
        eos_id=self.tok.eos_id, pad_id=self.tok.pad_id, vocab_size=self.tok.vocab_size,
        suppress_ids=generate_lib.never_written(self.tok, self.loaded.config.family))

  def _generate(self, contexts: list[str], gen: generate_lib.GenerationConfig) -> list[str]:
    """One batch, padded to ``batch_size`` rows and a bucketed width, so a
    few shapes compile; contexts too long are cut on the left."""
    room = self.max_length - (gen.max_new_tokens if self.backend == "causal" else 0)
    rows = [self.tok_encode(c)[-room:] or [self.prefix_token_id] for c in contexts]
    rows += [rows[0]] * (self.batch_size - len(rows))
    width = scoring.bucket(max(map(len, rows)), room)
    tokens = np.full((len(rows), width), self.tok.pad_id, np.int32)
    mask = np.zeros_like(tokens)
    for b, r in enumerate(rows):  # decoders read left-padded prompts
      if self.backend == "causal":
        tokens[b, width - len(r):], mask[b, width - len(r):] = r, 1
      else:
        tokens[b, :len(r)], mask[b, :len(r)] = r, 1
    new = generate_lib.generate(self.loaded.config, self.loaded.params, tokens, mask, gen=gen)
    texts = []
    for row in new[:len(contexts)]:
      ids = [int(t) for t in row]
      if gen.eos_id in ids:
        ids = ids[:ids.index(gen.eos_id)]
      texts.append(self.tok.decode(ids))
    return texts

