"""Generation throughput: jaxtl's KV-cache decoding beside ``transformers``'
``generate`` (``jaxtl benchmark --generate=1,32 --presets=gpt2_small --torch``).

Each decoder preset's model, with random weights (seed 0), writes
``new_tokens`` greedy tokens after prompts of ``prompt_len`` random tokens,
at each batch size. No row stops early (no EOS on either side), so both
write the same number of tokens. The PyTorch side loads the same weights,
exported by :func:`jaxtl.convert.hf.export_hf`, and calls ``generate`` with
its KV cache, in jaxtl's precision (bfloat16: weights cast, as bf16
inference runs). ``--dtype=auto`` is what the recipes compute in on this
device: bfloat16 on GPUs and TPUs and on CPUs whose bf16 matmuls pay
(there with row-major dots; a bf16 cache gains at batch 16 and is even at
batch 1 on a Zen 4), float32 elsewhere. "same tokens" is the share of
generated tokens on which both sides agree: greedy decoding of the same
weights, so it is near 100% unless rounding flips a near-tie.
"""

from __future__ import annotations

import json
import tempfile
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from jaxtl.convert import hf
from jaxtl.decoding import generate as generation
from jaxtl.models import TransformerConfig, build_model
from jaxtl.tools import presets
from jaxtl.tools.presets import PRESETS, Preset, model_config, time_steps

COLUMNS = ("preset", "batch", "prompt + new", "dtype", "jaxtl tokens/s", "jaxtl first call s",
           "PyTorch tokens/s", "PyTorch first call s", "jaxtl / PyTorch", "same tokens")


def _timed(run: Callable[[], np.ndarray], runs: int) -> tuple[float, float, np.ndarray]:
  """(first call's seconds, median seconds of ``runs`` more, the output)."""
  start = time.perf_counter()
  out = run()
  first = time.perf_counter() - start
  return first, time_steps(run, 0, runs), out


def run_jaxtl(cfg: TransformerConfig, params: Any, prompts: np.ndarray, new_tokens: int,
              runs: int) -> tuple[float, float, np.ndarray]:
  """jaxtl's greedy decoding of ``prompts`` (what ``jaxtl generate`` runs)."""
  gen = generation.GenerationConfig(max_new_tokens=new_tokens, eos_id=None)
  return _timed(lambda: generation.generate(cfg, params, prompts, gen=gen), runs)


def torch_generator(folder: str, bfloat16: bool
                    ) -> Callable[[np.ndarray, int], np.ndarray]:
  """``transformers``' greedy ``generate`` of the model exported to ``folder``:
  a function of (prompts, new tokens) that returns the new tokens."""
  # optional (pip install 'jaxtl[hf]'), heavy: ~2 s; only the PyTorch side needs them
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      folder, dtype=torch.bfloat16 if bfloat16 else torch.float32,
      attn_implementation="sdpa").to(device).eval()
  model.generation_config.eos_token_id = None  # every row writes new_tokens
  model.generation_config.pad_token_id = 0

  def run(prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    ids = torch.from_numpy(prompts.astype(np.int64)).to(device)
    with torch.inference_mode():
      out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[:, ids.shape[1]:].cpu().numpy()

  return run


def _decoder(name: str) -> Preset:
  preset = presets.lookup([name])[0]
  if preset.objective != "clm":
    raise ValueError(f"--generate times decoders; preset {name!r} is "
                     f"{preset.objective} (decoders: "
                     f"{', '.join(n for n, p in PRESETS.items() if p.objective == 'clm')})")
  return preset


def generation_rows(names: list[str], batch_sizes: list[int], *, prompt_len: int,
                    new_tokens: int, runs: int, dtype: str, torch_side: bool,
                    overrides: dict[str, Any] | None = None) -> list[dict[str, str]]:
  """One row per preset and batch size (jaxtl, and PyTorch with ``torch_side``);
  ``overrides`` are TransformerConfig fields (``--model``)."""
  rows = []
  for name in names:
    preset = _decoder(name)
    cfg = model_config(preset, dtype, **{**(overrides or {}), "dropout_rate": 0.0,
                                          "attention_dropout_rate": 0.0})
    if prompt_len + new_tokens > cfg.max_len:
      raise ValueError(f"--prompt_len={prompt_len} + --new_tokens={new_tokens} exceed "
                       f"{name}'s max_len {cfg.max_len}")
    model = build_model(cfg)
    params = nn.unbox(model.init(jax.random.key(0), np.ones((1, 8), np.int32))["params"])
    theirs = None
    if torch_side:
      with tempfile.TemporaryDirectory() as folder:
        # GPT-2's own 50256 lies outside a tiny vocabulary; no row stops anyway.
        last = preset.vocab_size - 1
        hf.export_hf(folder, cfg, jax.device_get(params),
                     config_fields={"bos_token_id": last, "eos_token_id": last})
        theirs = torch_generator(folder, cfg.dtype == "bfloat16")
    for b in batch_sizes:
      prompts = np.random.default_rng(b).integers(1, preset.vocab_size, (b, prompt_len),
                                                  dtype=np.int32)
      first, s, ours = run_jaxtl(cfg, params, prompts, new_tokens, runs)
      row = {"preset": name, "batch": str(b), "prompt + new": f"{prompt_len} + {new_tokens}",
             "dtype": cfg.dtype, "jaxtl tokens/s": f"{b * new_tokens / s:,.0f}",
             "jaxtl first call s": f"{first:.1f}"}
      if theirs is not None:
        t_first, t_s, out = _timed(lambda: theirs(prompts, new_tokens), runs)
        row.update({"PyTorch tokens/s": f"{b * new_tokens / t_s:,.0f}",
                    "PyTorch first call s": f"{t_first:.1f}",
                    "jaxtl / PyTorch": f"{t_s / s:.2f}x",
                    "same tokens": f"{100 * float(np.mean(ours == out)):.0f}%"})
      rows.append({c: row.get(c, "") for c in COLUMNS})
      print(json.dumps(rows[-1]), flush=True)
  return rows
