r"""``jaxtl analysis``: layer-wise linear probes and attention maps.

  jaxtl analysis probe --init_from=/tmp/mlm --task=trec --out=/tmp/probe
  jaxtl analysis attention --init_from=/tmp/mlm --text="..." --out=/tmp/attn

``probe`` trains a linear classifier on each layer's frozen states and
writes ``probe.md`` (the task's accuracy by layer) and ``probe.png`` into
``--out``; ``attention`` writes one PNG per layer, a heatmap per head.
``--init_from`` is a jaxtl pretraining workdir or a Hugging Face folder.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import app, flags

from jaxtl.programs import precision
from jaxtl.tools import analysis

flags.DEFINE_string("init_from", None, "A jaxtl pretraining workdir or a Hugging Face folder.")
flags.DEFINE_string("task", "trec", "probe: trec, sst2, cola, mrpc, rte, imdb or pos.")
flags.DEFINE_string("text", "What is the capital of France?", "attention: the text.")
flags.DEFINE_string("out", "analysis", "Output folder for tables and PNGs.")
flags.DEFINE_integer("max_len", 64, "Tokens per example.", lower_bound=1)
flags.DEFINE_integer("max_examples", 2000, "Examples per split for probing.", lower_bound=1)
precision.define_compute_dtype(__name__, "as the workdir records, and auto decides "
                               "again on this machine; a Hugging Face folder: float32")
flags.mark_flag_as_required("init_from")
FLAGS = flags.FLAGS


def main(argv: Sequence[str]) -> None:
  command = argv[1] if len(argv) > 1 else ""
  f = FLAGS
  if command == "probe":
    accs = analysis.probe_layers(f.init_from, f.task, f.max_len, f.max_examples,
                                 f.compute_dtype)
    analysis.write_probe_report(accs, f.task, f.out)
    print(open(os.path.join(f.out, "probe.md")).read())
  elif command == "attention":
    for path in analysis.attention_maps(f.init_from, f.text, f.out, f.compute_dtype):
      print(path)
  else:
    raise app.UsageError(f"unknown analysis {command!r}: jaxtl analysis "
                         "{probe,attention} --init_from=DIR ...")
