r"""``jaxtl generate``: text from a causal LM, a T5 or a BART.

  jaxtl generate --checkpoint=/tmp/clm --prompt="ROMEO:" --temperature=0.8 \
    --top_p=0.9 --max_new_tokens=60 --num_return_sequences=3

``--checkpoint`` is a jaxtl workdir or a Hugging Face GPT-2 / T5 / BART
folder; the decoding itself is :mod:`jaxtl.decoding.generate`.
"""

from __future__ import annotations

import jax
from absl import flags

from jaxtl.decoding.generate import GenerationConfig, generate, never_written, prompt_arrays
from jaxtl.models import family_of
from jaxtl.pretraining import pretrained
from jaxtl.programs import precision

flags.DEFINE_string("checkpoint", None, "A jaxtl workdir or a Hugging Face folder.",
                    required=True)
flags.DEFINE_multi_string("prompt", None, "A text: a causal LM continues it, a T5 or a BART answers it",
                          required=True)
flags.DEFINE_string("tokenizer", "", "Tokenizer path (default: the checkpoint's).")
flags.DEFINE_integer("max_new_tokens", 40, "Tokens to generate.", lower_bound=1)
flags.DEFINE_float("temperature", 0.0, "0: greedy; > 0: sample.", lower_bound=0.0)
flags.DEFINE_integer("top_k", 0, "Sample among the k likeliest (0: all).", lower_bound=0)
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass.", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_float("repetition_penalty", 1.0, "> 1 discourages repeats.")
flags.DEFINE_integer("num_return_sequences", 1, "Outputs per prompt.", lower_bound=1)
flags.DEFINE_integer("num_beams", 1, "Beam search width (T5, BART).", lower_bound=1)
flags.DEFINE_float("length_penalty", 1.0, "Beam score / length**this.")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
precision.define_compute_dtype(__name__, "as the workdir records, and auto decides "
                               "again on this machine; a Hugging Face folder: float32")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  f = FLAGS
  loaded = pretrained.load(f.checkpoint, f.tokenizer, f.compute_dtype)
  tok = loaded.tokenizer
  gen = GenerationConfig(
      max_new_tokens=f.max_new_tokens, temperature=f.temperature, top_k=f.top_k,
      top_p=f.top_p, repetition_penalty=f.repetition_penalty,
      num_return_sequences=f.num_return_sequences, num_beams=f.num_beams,
      length_penalty=f.length_penalty, eos_id=tok.eos_id, pad_id=tok.pad_id,
      vocab_size=tok.vocab_size, suppress_ids=never_written(tok, loaded.config.family))
  tokens, mask = prompt_arrays(tok, f.prompt, loaded.config.family)
  out = generate(loaded.config, loaded.params, tokens, mask, gen=gen,
                 rng=jax.random.key(f.seed))
  for i, row in enumerate(out):
    prompt = f.prompt[i // gen.num_return_sequences]
    text = tok.decode([int(t) for t in row])
    print(f"[{i}] {prompt}{'' if family_of(loaded.config).causal else ' ->'} {text}")
