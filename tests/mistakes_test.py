"""A user's mistake in any command is one line naming the thing and the
fix, exit 2, no traceback (``--verbose`` adds it): each command driven for
real (``python -m jaxtl``), with mistakes a first user makes."""

import os
import subprocess
import sys

import pytest

import runs

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

MISSING = "/nonexistent/jaxtl-model"

# (the command's arguments, what its one line must say)
CASES = [
    (["pretrain", "--config=finetune", "--workdir={tmp}/a"],
     "jaxtl pretrain: this config has no data section, and `jaxtl pretrain` (--mode="
     "pretrain) runs configs/pretrain_*.py: it is a finetune recipe: run it with "
     "`jaxtl finetune`"),
    (["pretrain", "--config=pretrain_clm", "--workdir={tmp}/b", "--config.optim.lrr=1"],
     "jaxtl pretrain: config.optim has no key 'lrr'; it has accum_steps, b1, b2, "
     "clip_norm, end_lr_ratio, eps, lr, schedule,"),
    (["finetune", "--config=finetune:task=trec", "--workdir={tmp}/c",
      f"--config.init_from={MISSING}"], f"jaxtl finetune: {MISSING}: no such folder"),
    (["finetune", "--config=finetune:task=trek", "--workdir={tmp}/d"],
     "jaxtl finetune: bad flag or config override: unknown task 'trek' (trec?); known: "
     "cola, files,"),
    (["finetune", "--config=finetune:task=trec", "--workdir={tmp}/e"],
     "jaxtl finetune: config.init_from is empty: set --config.init_from=MODEL"),
    (["study", "--config=pretrain_clm", "--workdir={tmp}/f"],
     "jaxtl study: this config has no pretrain section"),
    (["predict", f"--workdir={MISSING}", "--input=-"], f"jaxtl predict: {MISSING}: no such folder"),
    (["generate", f"--checkpoint={MISSING}", "--prompt=Hi"], f"jaxtl generate: {MISSING}: no such"),
    (["prompt", f"--checkpoint={MISSING}", "--task=trec"], f"jaxtl prompt: {MISSING}: no such"),
    (["convert", f"--checkpoint={MISSING}", "--out={tmp}/out"], f"jaxtl convert: {MISSING}: no such"),
    (["analysis", "probe", f"--init_from={MISSING}"], f"jaxtl analysis: {MISSING}: no such"),
    (["pretokenize", "--config=pretrain_nope", "--out={tmp}/p"],
     "jaxtl pretokenize: --config=pretrain_nope: no such file, and 'pretrain_nope' is not"),
    (["pretrian"], "jaxtl: unknown command 'pretrian' (pretrain?); known: pretrain, finetune"),
    (["pretrain", "--config=pretrain_mlm", "--workdir={tmp}/g", "--config.model.dtype=bf16"],
     "jaxtl pretrain: config.model.dtype='bf16'; expected one of auto, float32, bfloat16"),
    (["benchmark", "--presets=tiny_cls", "--steps=0"],
     "jaxtl benchmark: bad flag or config override: flag --steps=0: 0 is not a positive"),
    (["predict", f"--workdir={MISSING}", "--input=-", "--batch_size=0"],
     "jaxtl predict: bad flag or config override: flag --batch_size=0: 0 is not a positive"),
    (["benchmark", "--presets=tiny_cls", "--devices=999"],
     "jaxtl benchmark: --devices=999: this machine has"),
    (["prompt", "--task=trec"], "jaxtl prompt: --checkpoint is needed; jaxtl prompt "
     "--help says what each flag is"),
    (["lm_eval", "--tasks=nope"], "jaxtl lm_eval: Tasks not found: nope"),
    (["finetune", "--workdir={tmp}/h", "--config.train.epochs=1"],
     "jaxtl finetune: --config.train.epochs sets a key of a recipe, and no recipe is "
     "named: add --config=RECIPE (jaxtl finetune --help lists the recipes)"),
]


def _start(args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": runs.XLA_FLAGS,
         "JAXTL_KEEP_MEMORY": "0"}
  return subprocess.Popen([sys.executable, "-m", "jaxtl", *args], cwd=runs.REPO,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_every_command_names_a_mistake_in_one_line_and_exits_2(tmp_path):
  procs = [_start([a.format(tmp=tmp_path) for a in args]) for args, _ in CASES]
  verbose = _start(["finetune", "--config=finetune:task=trec", f"--workdir={tmp_path}/v",
                    f"--config.init_from={MISSING}", "--verbose"])
  for (args, message), proc in zip(CASES, procs):
    _, err = proc.communicate(timeout=300)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 2, (args, err[-2000:])
    assert last.startswith(message), (args, last)
    assert "Traceback" not in err, (args, err[-2000:])
  _, err = verbose.communicate(timeout=300)
  assert verbose.returncode != 0 and "Traceback" in err and "no such folder" in err
  # A run that failed at its start left no empty workdir behind.
  assert not [p for p in tmp_path.iterdir() if p.name != "out"], list(tmp_path.iterdir())
