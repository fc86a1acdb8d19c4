"""A BART pretraining workdir's validation loss, split into the tokens the
noise masked (infilled) and the ones the encoder saw (copied).

The pretraining log reports the loss over every target token, most of which
the model can copy; this tells the two apart. Rows are the validation text
cut into 128-token rows (EOS between lines), noised as the recipe does
(sentence permutation, then 30% infilling in Poisson(3) spans).

  python launch/bart_masked_loss.py --workdir=/tmp/bart \
    --text=../shared/data/wikitext2/valid.txt --rows=64
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jaxtl import objectives
from jaxtl.objectives import denoising
from jaxtl.models import build_model
from jaxtl.objectives import bart
from jaxtl.objectives.span import encoder_decoder_example
from jaxtl.pretraining import pretrained


def noised(tokens: np.ndarray, ends: np.ndarray, seed: int, mask_id: int
           ) -> tuple[denoising.Infilled, np.ndarray]:
  """The infilled input of ``tokens`` and which original positions it masks."""
  rng = np.random.default_rng(seed)
  permuted = denoising.permute_sentences(tokens, ends[tokens], rng)
  # The same draws move the positions as they moved the tokens.
  where = denoising.permute_sentences(np.arange(len(tokens)), ends[tokens],
                                      np.random.default_rng(seed))
  infilled = denoising.text_infill(permuted, rng, mask_id=mask_id)
  masked = np.zeros(len(tokens), bool)
  for start, stop in infilled.spans:
    masked[where[start:stop]] = True
  return infilled, masked


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--text", required=True)
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--length", type=int, default=128)
  args = parser.parse_args()
  model_dir = pretrained.load(args.workdir)
  tok, length = model_dir.tokenizer, args.length
  ids = []
  with open(args.text, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        ids += tok.encode(line.strip()) + [tok.eos_id]
  rows = np.array(ids[:len(ids) // length * length], np.int32).reshape(-1, length)
  ends = bart.sentence_end_table(tok)
  examples, masked = [], []
  for i, tokens in enumerate(rows[:args.rows]):
    infilled, m = noised(tokens, ends, 1000 + i, tok.mask_id)
    examples.append(encoder_decoder_example(infilled.inputs, tokens, tok.pad_id,
                                            length, length))
    masked.append(m)
  batch = {k: jnp.asarray(np.stack([e[k] for e in examples])) for k in examples[0]}
  logits = objectives.forward(build_model(model_dir.config), model_dir.params,
                              batch)["logits"].astype(jnp.float32)
  targets = batch["decoder_target_tokens"][..., None]
  nll = np.asarray(jax.nn.logsumexp(logits, -1)
                   - jnp.take_along_axis(logits, targets, -1)[..., 0])
  masked = np.stack(masked)
  print(f"{len(masked)} rows: all {nll.mean():.3f} nats, masked {nll[masked].mean():.3f} "
        f"({masked.mean():.1%} of tokens), visible {nll[~masked].mean():.3f}")


if __name__ == "__main__":
  main()
