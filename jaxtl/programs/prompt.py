r"""``jaxtl prompt``: few-shot accuracy against the number of shots, the
GPT-3 table, for a jaxtl causal model.

  jaxtl prompt --checkpoint=workdirs/study/pretrain_clm --task=trec,sst2 \
    --shots=0,1,4,8 --seeds=0,1,2 --max_len=64 --out=workdirs/prompting

For each task, number of shots k and seed, the test inputs are prompted
after k demonstrations from the task's training split and scored by the
likeliest label word, with and without calibration. It prints the table
and, with ``--out``, writes ``prompting.md``, ``prompting.png`` (accuracy
against k) and ``prompting.json`` (every run) there.
"""

from __future__ import annotations

import logging
import os

from absl import app, flags

from jaxtl.eval import few_shot, prompting
from jaxtl.models.family import family_of
from jaxtl.pretraining import pretrained
from jaxtl.programs import precision

flags.DEFINE_string("checkpoint", None, "A jaxtl workdir or a Hugging Face folder.",
                    required=True)
flags.DEFINE_string("tokenizer", "", "Overrides the model's tokenizer.")
flags.DEFINE_list("task", ["trec"], "Built-in classification tasks.")
flags.DEFINE_list("shots", ["0", "1", "4", "8"], "Demonstrations per prompt.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Draws of demonstrations (k > 0).")
flags.DEFINE_string("template", "", "Prompt template ({text}, {text_pair}, ending "
                    "in {label}); default: the task's (jaxtl.eval.prompting.PROMPTS).")
flags.DEFINE_list("label_words", [], "Words per class, in class-id order (with "
                  "--template).")
flags.DEFINE_bool("calibrate", True, "Also score with contextual calibration.")
flags.DEFINE_integer("max_len", 0, "Tokens the model reads (0: its max_len).", lower_bound=0)
flags.DEFINE_integer("batch_size", 32, "Rows per forward pass.", lower_bound=1)
flags.DEFINE_integer("max_eval_examples", 0, "Score a fixed sample (0: all).", lower_bound=0)
flags.DEFINE_string("out", "", "Folder for prompting.{md,png,json} (default: "
                    "print the table only).")
precision.define_compute_dtype(__name__, "as the workdir records, and auto decides "
                               "again on this machine; a Hugging Face folder: float32")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = FLAGS
  prompts = None
  if f.template or f.label_words:
    if len(f.task) != 1:
      raise app.UsageError("--template/--label_words describe one task: pass one --task")
    prompts = {f.task[0]: prompting.Prompt(f.template, tuple(f.label_words))}
  loaded = pretrained.load(f.checkpoint, f.tokenizer, f.compute_dtype)
  no_prompting = family_of(loaded.config).generation_error(
      f"--checkpoint={f.checkpoint} (few-shot prompting)")
  if no_prompting:
    raise app.UsageError(no_prompting)
  rows = few_shot.run(loaded, f.task, [int(k) for k in f.shots],
                      [int(s) for s in f.seeds], calibrated=f.calibrate,
                      batch_size=f.batch_size, max_len=f.max_len or None,
                      max_eval_examples=f.max_eval_examples, prompts=prompts)
  print(few_shot.markdown_table(rows))
  if f.out:
    few_shot.write(rows, f.out)
    logging.info("wrote %s", ", ".join(os.path.join(f.out, n)
                                        for n in (few_shot.MARKDOWN, few_shot.FIGURE,
                                                 few_shot.RESULTS)))
