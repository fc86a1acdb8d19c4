"""The benchmark harness: tiny presets run on both sides and are profiled;
FLOPs by hand."""

import gzip
import importlib.util
import json
import pathlib
import shutil
import sys
import time

import flax.linen as nn
import jax
import numpy as np
import pytest

from jaxtl.runtime import xla_cpu
from jaxtl.tools import (benchmark, benchmark_generate, benchmark_keras, footprint,
                         other_checkout, presets)
from jaxtl.train import perf
from jaxtl.objectives import corruption
from jaxtl.models import build_model

import datadir

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_presets_run_and_append_a_results_table(tmp_path):
  torch_side = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
  keras_side = benchmark_keras.available()
  names = ["tiny_gpt2", "tiny_bert", "tiny_t5", "tiny_cls"]
  # One layer (of each stack): the harness is the same at any depth, and both
  # sides compile less (the presets' 4 layers: 52 -> 40 CPU s ours, 26 -> 17 theirs).
  rows = benchmark.benchmark(names, torch_side=torch_side, keras_side=keras_side,
                             warmup=1, steps=2,
                             num_devices=1, profile_dir=str(tmp_path / "profile"),
                             overrides={"num_layers": 1, "num_decoder_layers": 1})
  assert [r["preset"] for r in rows] == names
  for name in names:  # each traced, its XLA:CPU thunks sorted by kind
    breakdown = json.loads((tmp_path / "profile" / name / "op_breakdown.json").read_text())
    kinds = {k["kind"]: k["ms_per_step"] for k in breakdown["kinds"]}
    assert breakdown["source"].startswith("host") and kinds["matmul"] > 0, breakdown
    assert sum(kinds.values()) == pytest.approx(breakdown["ms_per_step"], abs=0.1)
  for r in rows:
    assert float(r["step ms"]) > 0 and float(r["compile s"]) > 0
    assert r["MFU"] == "n/a"  # no peak FLOP/s is known for CPUs
    assert r["dtype"] == "float32"
    # The ratio is printed to 2 decimals (0.48x for 0.4852): 0.005 off at most.
    if torch_side:
      ratio = float(r["PyTorch step ms"]) / float(r["step ms"])  # both rounded
      assert float(r["jaxtl / PyTorch"][:-1]) == pytest.approx(ratio, rel=0.01, abs=0.006)
    if keras_side:  # KerasHub built every preset's model and stepped it
      ratio = float(r["KerasHub step ms"]) / float(r["step ms"])
      assert float(r["jaxtl / KerasHub"][:-1]) == pytest.approx(ratio, rel=0.01, abs=0.006)
      assert float(r["KerasHub compile s"]) > 0
  path = tmp_path / "results.md"
  benchmark.append_results(str(path), rows, "python -m jaxtl.tools.benchmark")
  benchmark.append_results(str(path), rows[:1], "again")
  text = path.read_text()
  assert text.count("### ") == 2 and "`python -m jaxtl.tools.benchmark`" in text
  assert "| tiny_t5 | 4 x 128+32 | float32 |" in text


def test_alternated_rounds_reverse_the_order_and_count_the_faster():
  calls = []

  def run(name, seconds):
    return lambda: (calls.append(name), time.sleep(seconds))

  medians, wins = presets.time_alternated([run("a", 0.006), run("b", 0.001)],
                                          warmup=1, steps=2, rounds=3)
  assert calls == ["a", "b"] + ["a"] * 2 + ["b"] * 4 + ["a"] * 4 + ["b"] * 2
  assert wins == [0, 3] and medians[0] > medians[1] >= 0.001


def test_a_change_is_timed_against_the_step_as_configured():
  changed = benchmark.parse_overrides(
      ["attention_dropout_rate=0", "xla_cpu_enable_fast_math=true"], "--versus",
      versus_items=True)
  assert changed == {"attention_dropout_rate": 0.0, "xla_cpu_enable_fast_math": True}
  with pytest.raises(ValueError, match="--versus 'nope=1'.*xla_NAME=VALUE"):
    benchmark.parse_overrides(["nope=1"], "--versus", versus_items=True)
  with pytest.raises(ValueError, match="--versus num_layers=1: the same model"):
    benchmark.versus(["tiny_cls"], {"num_layers": 1}, warmup=1, steps=1, rounds=1,
                     overrides={"num_layers": 1})
  for option, says in (("xla_cpu_nope", "No such compile option: 'xla_cpu_nope'"),
                       ("xla_cpu_enable_fast_math", "'maybe' is not a valid bool")):
    with pytest.raises(ValueError, match=f"^--versus: .*{says}"):
      benchmark.versus(["tiny_cls"], {option: "maybe"}, warmup=1, steps=1, rounds=1,
                       overrides={"num_layers": 1})
  rows = benchmark.versus(["tiny_cls"], changed, warmup=1, steps=1, rounds=2,
                          dtype="float32", overrides={"num_layers": 1})
  assert [r["change"] for r in rows] == [
      "as configured", "attention_dropout_rate=0.0, xla_cpu_enable_fast_math=True"]
  assert [r["attention"] for r in rows][0] == "explicit (dropout)" != rows[1]["attention"]
  assert sum(int(r["faster in"].split()[0]) for r in rows) == 2
  assert all(float(r["step ms"]) > 0 for r in rows)


def test_row_major_dots_off_where_a_cpu_rule_turns_them_on_names_the_rule(monkeypatch):
  monkeypatch.setattr(xla_cpu, "row_major_dots", lambda backend, dtype: True)
  with pytest.raises(ValueError, match="rule turns them on: time it off with "
                     "--versus=cpu_rule=FLOAT32_ROW_MAJOR_RULES"):
    benchmark.versus(["tiny_cls"], {"row_major_dots": False}, warmup=1, steps=1,
                     rounds=1, dtype="float32")


def test_another_checkout_is_timed_against_this_one_in_one_process(tmp_path):
  """tree=PATH builds the step from that checkout's own modules, and leaves
  this checkout's in place; a tree holding this very code builds the same
  program. commit=REV reads a commit with git archive."""
  assert benchmark.parse_overrides(["tree=/x"], "--versus", versus_items=True) == {
      "tree": "/x"}
  with pytest.raises(ValueError, match="'commit=': expected commit=REV"):
    benchmark.parse_overrides(["commit="], "--versus", versus_items=True)
  with pytest.raises(ValueError, match="give it alone"):
    benchmark.versus(["tiny_cls"], {"tree": "/x", "num_layers": 1}, warmup=1, steps=1,
                     rounds=1)
  with pytest.raises(ValueError, match=f"tree={tmp_path}: no jaxtl package there"):
    benchmark.versus(["tiny_cls"], {"tree": str(tmp_path)}, warmup=1, steps=1, rounds=1)
  shutil.copytree(REPO / "jaxtl", tmp_path / "jaxtl",
                  ignore=shutil.ignore_patterns("__pycache__"))
  ours = sys.modules["jaxtl.tools.benchmark"]
  rows = benchmark.versus(["tiny_cls"], {"tree": str(tmp_path)}, warmup=1, steps=1,
                          rounds=2, dtype="float32", overrides={"num_layers": 1})
  assert sys.modules["jaxtl.tools.benchmark"] is ours
  assert [r["change"] for r in rows] == ["as configured", f"tree {tmp_path}"]
  assert rows[0]["attention"] == rows[1]["attention"] and rows[1]["dtype"] == "float32"
  assert sum(int(r["faster in"].split()[0]) for r in rows) == 2
  with other_checkout.imported(str(tmp_path)) as theirs:
    assert theirs.__file__.startswith(str(tmp_path))
    preset, = theirs.sized(theirs.lookup(["tiny_cls"]), 0, 0, 1)
    program = theirs.jaxtl_program(preset, theirs.model_config(
        preset, "float32", num_layers=1), jax.devices()[:1])
  mine = benchmark.jaxtl_program(preset, benchmark.model_config(
      preset, "float32", num_layers=1), jax.devices()[:1])
  assert benchmark.same_program(program.compiled, mine.compiled)
  if shutil.which("git") and (REPO / ".git").exists():
    with pytest.raises(ValueError, match="commit=no-such-rev: git archive .* failed"):
      benchmark.versus(["tiny_cls"], {"commit": "no-such-rev"}, warmup=1, steps=1,
                       rounds=1)
    with other_checkout.commit_tree("HEAD") as tree:
      assert (pathlib.Path(tree) / "jaxtl" / "tools" / "benchmark.py").is_file()
    assert not pathlib.Path(tree).exists()


@pytest.mark.slow
def test_a_cpu_rule_is_timed_with_this_cpu_moved_into_or_out_of_its_table(monkeypatch):
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)  # the suite opts out
  assert benchmark.parse_overrides(["cpu_rule=FLOAT32_FOLDED_DX_RULES"], "--versus",
                                   versus_items=True) == {
                                       "cpu_rule": "FLOAT32_FOLDED_DX_RULES"}
  with pytest.raises(ValueError, match="--versus 'cpu_rule=NOPE': expected cpu_rule=TABLE"):
    benchmark.parse_overrides(["cpu_rule=NOPE"], "--versus", versus_items=True)
  tiny = {"num_layers": 1, "row_major_dots": True}
  # float32 asked for by name: the bf16 table cannot reach the step.
  with pytest.raises(ValueError, match="same program either way .* does not reach it"):
    benchmark.versus(["tiny_cls"], {"cpu_rule": "BF16_RULES"}, warmup=1, steps=1,
                     rounds=1, dtype="float32", overrides=tiny)
  table = xla_cpu.FLOAT32_FOLDED_DX_RULES
  rows = benchmark.versus(["tiny_cls"], {"cpu_rule": "FLOAT32_FOLDED_DX_RULES"},
                          warmup=1, steps=1, rounds=1, dtype="float32", overrides=tiny)
  inside = "in" if not xla_cpu.folds_float32_dx("cpu") else "out"
  assert [r["change"] for r in rows] == [
      "as configured", f"cpu_rule=FLOAT32_FOLDED_DX_RULES (this CPU {inside})"]
  assert xla_cpu.FLOAT32_FOLDED_DX_RULES is table  # put back


def test_a_win_count_comes_with_its_chance_under_equal_speeds():
  """faster_in's p is the binomial tail P[wins or more] at 1/runs a round."""
  assert presets.faster_in(6, 6) == "6 of 6 rounds (p=0.016)"  # 1/64
  assert presets.faster_in(0, 6) == "0 of 6 rounds (p=1)"
  assert presets.faster_in(4, 6) == "4 of 6 rounds (p=0.34)"  # 22/64
  assert presets.faster_in(2, 2, runs=3) == "2 of 2 rounds (p=0.11)"  # 1/9


def test_on_a_cpu_jaxtl_and_pytorch_take_turns_and_the_row_says_who_won(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  rows = benchmark.benchmark(["tiny_cls"], torch_side=True, warmup=0, steps=1, rounds=2,
                             num_devices=1, overrides={"num_layers": 1},
                             profile_dir=str(tmp_path))
  (r,) = rows
  assert r["jaxtl faster in"] in ("0 of 2 rounds (p=1)", "1 of 2 rounds (p=0.75)",
                                 "2 of 2 rounds (p=0.25)")
  ratio = float(r["PyTorch step ms"]) / float(r["step ms"])
  assert float(r["jaxtl / PyTorch"][:-1]) == pytest.approx(ratio, rel=0.01, abs=0.006)
  assert (tmp_path / "tiny_cls" / "op_breakdown.json").exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pytorch_computes_in_the_dtype_jaxtl_does(dtype, monkeypatch):
  """bf16 rows compare bf16 with bf16 on CPUs too (autocast was GPU-only)."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from jaxtl.tools import benchmark_torch
  asked = []
  autocast = torch.autocast
  monkeypatch.setattr(torch, "autocast", lambda device_type, dtype=None, enabled=True:
                      asked.append((device_type, dtype, enabled)) or autocast(
                          device_type, dtype, enabled=enabled))
  preset = presets.PRESETS["tiny_cls"]
  cfg = presets.model_config(preset, dtype, num_layers=1)
  assert benchmark_torch.run_torch(preset, cfg, warmup=0, steps=1).step_s > 0
  assert asked == [("cpu", torch.bfloat16, dtype == "bfloat16")]


def test_generation_beside_transformers_writes_the_same_tokens():
  """Both sides decode the same exported weights greedily: the same tokens."""
  torch_side = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
  rows = benchmark_generate.generation_rows(
      ["tiny_gpt2"], [1, 3], prompt_len=8, new_tokens=6, runs=1, dtype="auto",
      torch_side=torch_side, overrides={"num_layers": 1})
  assert [(r["preset"], r["batch"], r["prompt + new"]) for r in rows] == [
      ("tiny_gpt2", "1", "8 + 6"), ("tiny_gpt2", "3", "8 + 6")]
  for r in rows:
    assert float(r["jaxtl tokens/s"].replace(",", "")) > 0
    if torch_side:
      assert r["same tokens"] == "100%", r
      assert float(r["PyTorch tokens/s"].replace(",", "")) > 0
  with pytest.raises(ValueError, match="times decoders; preset 'tiny_bert' is mlm"):
    benchmark_generate.generation_rows(["tiny_bert"], [1], prompt_len=8, new_tokens=6,
                                       runs=1, dtype="auto", torch_side=False)
  with pytest.raises(ValueError, match="exceed tiny_gpt2's max_len"):
    benchmark_generate.generation_rows(["tiny_gpt2"], [1], prompt_len=8, new_tokens=9999,
                                       runs=1, dtype="auto", torch_side=False)


def test_the_pytorch_generator_decodes_in_jaxtls_precision(monkeypatch):
  """bf16 generation rows compare with bf16 weights on CPUs too (they were
  cast on GPUs only)."""
  asked = []
  monkeypatch.setattr(benchmark_generate, "torch_generator", lambda folder, bfloat16: (
      asked.append(bfloat16) or (lambda prompts, n: np.zeros((len(prompts), n), np.int32))))
  for dtype in ("float32", "bfloat16"):
    rows = benchmark_generate.generation_rows(
        ["tiny_gpt2"], [1], prompt_len=4, new_tokens=2, runs=1, dtype=dtype,
        torch_side=True, overrides={"num_layers": 1})
    assert rows[0]["dtype"] == dtype
  assert asked == [False, True]


def test_a_stalled_call_is_not_charged_to_its_host_op(tmp_path):
  from jaxtl.tools import profiling  # pylint: disable=g-import-not-at-top
  x = lambda name, dur, pid=1: {"ph": "X", "name": name, "dur": dur, "pid": pid, "ts": 0}
  events = ([x("transpose.3", us) for us in (300, 310, 290, 20_000)]  # one stall
            + [x("transpose.4", 100)] * 4 + [x("ynn_fusion.1", 1000)] * 4
            + [x("$python frame", 9_999_999)] + [x("cond.7", 5_000)] * 4
            + [x("CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice", 9_000)] * 4)
  trace = tmp_path / "plugins" / "profile" / "run" / "perfetto_trace.json.gz"
  trace.parent.mkdir(parents=True)
  with gzip.open(trace, "wt") as f:
    json.dump({"traceEvents": events}, f)
  ops = {o["op"]: o for o in profiling.op_breakdown(str(tmp_path), steps=4)["ops"]}
  assert ops["transpose"]["ms_per_step"] == pytest.approx(0.305 + 0.1, abs=0.01)
  assert ops["transpose"]["per_step"] == 2 and ops["ynn_fusion"]["kind"] == "matmul"
  # A device's kernel names cover launches of many shapes: summed as they are.
  events = [x("nvjet_gemm", us, pid=2) for us in (100, 100, 100, 5_000)] + [
      {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}}]
  with gzip.open(trace, "wt") as f:
    json.dump({"traceEvents": events}, f)
  assert profiling.op_breakdown(str(tmp_path), steps=4)["ms_per_step"] == 1.32


def test_fusion_summaries_say_what_each_fusion_computes():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxtl.tools import profiling  # pylint: disable=g-import-not-at-top
  hlo = jax.jit(lambda x: jax.nn.softmax(x @ x.T) * 2).lower(
      jnp.ones((8, 8))).compile().as_text()
  what = profiling.fusion_summaries(hlo)
  exp = [v for v in what.values() if "exponential" in v]
  assert exp and exp[0].startswith("f32[8,8] "), what
  assert all("." not in k for k in what)  # keyed as kernels are named in traces


def _write_trace(logdir, thunks: list[tuple[str, float]]) -> None:
  """A perfetto trace under ``logdir`` of host thunks (name, microseconds)."""
  trace = logdir / "plugins" / "profile" / "run" / "perfetto_trace.json.gz"
  trace.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(trace, "wt") as f:
    json.dump({"traceEvents": [{"ph": "X", "name": name, "dur": dur, "pid": 1, "ts": 0}
                               for name, dur in thunks]}, f)


def test_a_host_op_summed_over_instances_says_what_its_costliest_does(tmp_path):
  from jaxtl.tools import profiling  # pylint: disable=g-import-not-at-top
  hlo = "\n".join([
      "%small (p: f32[2]) -> f32[2] {", "  %n = f32[2] negate(f32[2] %p)", "}",
      "%big (p: f32[64]) -> f32[64] {", "  %e = f32[64] exponential(f32[64] %p)", "}",
      "ENTRY %main (a: f32[2], b: f32[64]) -> f32[64] {",
      "  %loop_fusion = f32[2]{0} fusion(f32[2] %a), kind=kLoop, calls=%small",
      "  %loop_fusion.1 = f32[64]{0} fusion(f32[64] %b), kind=kLoop, calls=%big", "}"])
  _write_trace(tmp_path, [("loop_fusion", 10), ("loop_fusion.1", 900)])  # one step
  [op] = profiling.op_breakdown(str(tmp_path), steps=1, hlo_text=hlo)["ops"]
  assert (op["op"], op["per_step"]) == ("loop_fusion", 2)
  assert op["what"].startswith("f32[64] exponential"), op


def test_a_profile_gives_each_dot_form_its_gflops(tmp_path):
  """The dots table: each form (``.T`` marks an operand read transposed),
  its calls and GFLOP/s from the HLO's shapes; a library fusion around a
  reduction (XLA:CPU's ynn_fusion of a layer norm's sum) is not a matmul."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxtl.tools import profiling  # pylint: disable=g-import-not-at-top
  hlo = jax.jit(lambda x, w, v: (x @ w, x @ v.T)).lower(
      jnp.ones((8, 16)), jnp.ones((16, 4)), jnp.ones((4, 16))).compile().as_text()
  forms = sorted(set(profiling.dot_forms(hlo).values()))  # a fusion and its dot
  assert forms == [("f32[8,16] @ f32[16,4] -> f32[8,4]", 1024.0),
                   ("f32[8,16] @ f32[4,16].T -> f32[8,4]", 1024.0)], forms
  hlo = "\n".join([
      "%dots (p: bf16[64,32], q: bf16[32,16]) -> f32[64,16] {",
      "  %p = bf16[64,32]{1,0} parameter(0)", "  %q = bf16[32,16]{1,0} parameter(1)",
      "  ROOT %d = f32[64,16]{1,0} dot(%p, %q), lhs_contracting_dims={1}, "
      "rhs_contracting_dims={0}", "}",
      "%sums (p: f32[64,16]) -> f32[64] {", "  %p.1 = f32[64,16]{1,0} parameter(0)",
      "  ROOT %r = f32[64]{0} reduce(%p.1, %c), dimensions={1}, to_apply=%add", "}",
      "ENTRY %main (a: bf16[64,32], b: bf16[32,16]) -> f32[64] {",
      "  %ynn_fusion = f32[64,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%dots",
      "  %ynn_fusion.1 = f32[64]{0} fusion(%ynn_fusion), kind=kCustom, calls=%sums", "}"])
  _write_trace(tmp_path, [("ynn_fusion", 2), ("ynn_fusion.1", 1)] * 2)  # two steps
  breakdown = profiling.op_breakdown(str(tmp_path), steps=2, hlo_text=hlo)
  [dot] = breakdown["dots"]
  assert dot == {"dot": "bf16[64,32] @ bf16[32,16] -> f32[64,16]", "per_step": 1,
                 "ms_per_step": 0.0, "GFLOP/s": round(2 * 64 * 32 * 16 / 2e3)}
  kinds = {k["kind"]: k["ms_per_step"] for k in breakdown["kinds"]}
  assert set(kinds) == {"matmul", "other fusions"}, kinds
  assert "GFLOP/s" in profiling.markdown("t", breakdown)


def test_batches_have_the_layout_each_loss_reads():
  mlm = presets.make_batch(presets.PRESETS["bert_base"])
  # 15% of 512 positions carry loss, as the MLM pipeline bounds them.
  assert (mlm["encoder_loss_weights"].sum(1) == 77).all()
  span = presets.make_batch(presets.PRESETS["tiny_t5"])
  np.testing.assert_array_equal(span["decoder_input_tokens"][:, 1:],
                                span["decoder_target_tokens"][:, :-1])
  clm = presets.make_batch(presets.PRESETS["tiny_gpt2"])
  np.testing.assert_array_equal(clm["decoder_input_tokens"][:, 1:],
                                clm["decoder_target_tokens"][:, :-1])


def test_keras_side_reads_the_same_batch():
  """KerasHub's BertMaskedLM predicts at given positions: the rows' loss
  positions, with their targets; the other tasks read the batch as is."""
  preset = presets.PRESETS["tiny_bert"]
  batch = presets.make_batch(preset)
  inputs, labels, weights = benchmark_keras.keras_batch(preset)
  positions = inputs["mask_positions"]
  assert positions.shape == labels.shape == weights.shape == (4, 20)
  for row, where in enumerate(positions):
    np.testing.assert_array_equal(where, np.flatnonzero(batch["encoder_loss_weights"][row]))
    np.testing.assert_array_equal(labels[row], batch["encoder_target_tokens"][row, where])
  inputs, labels, weights = benchmark_keras.keras_batch(presets.PRESETS["tiny_t5"])
  assert inputs["decoder_token_ids"].shape == labels.shape == weights.shape == (4, 32)
  inputs, labels, _ = benchmark_keras.keras_batch(presets.PRESETS["tiny_cls"])
  assert inputs["padding_mask"].all() and labels.shape == (8,)


def test_keras_side_says_what_to_install_and_what_does_not_fit(monkeypatch):
  monkeypatch.setattr(benchmark_keras, "available", lambda: False)
  with pytest.raises(ImportError, match="pip install --no-deps keras-hub"):
    benchmark.benchmark(["tiny_bert"], torch_side=False, keras_side=True, warmup=0, steps=1)
  preset = presets.PRESETS["tiny_bert"]
  cfg = presets.model_config(preset, "float32", head_dim=32)
  with pytest.raises(ValueError, match="split d_model 128 over 2 heads"):
    benchmark_keras.build_task(preset, cfg)


def test_gpt2_small_flops_per_token_by_hand():
  """6 x 84.9M layer weights + attention + the 50304 x 768 head, per token."""
  preset = presets.PRESETS["gpt2_small"]
  cfg = presets.model_config(preset, "float32")
  tokens = np.zeros((1, 8), np.int32)
  params = nn.unbox(jax.eval_shape(build_model(cfg).init, jax.random.key(0), tokens))["params"]
  layer = 4 * 768 * 768 + 2 * 768 * 3072
  expected = 6 * 12 * layer + 12 * 12 * 768 * 1024 + 6 * 50304 * 768
  got = perf.flops_per_example(cfg, params, 1024) / 1024
  assert got == pytest.approx(expected, rel=1e-9)
  # MLM: the head only at the masked positions; a task head: no LM head at all.
  assert perf.flops_per_example(cfg, params, 1024, head_positions=0) == pytest.approx(
      1024 * (expected - 6 * 50304 * 768))
  # Pooled by a task head: the last layer's queries, output and MLP at one token.
  once = 6 * (layer - 2 * 768 * 768) + 12 * 768 * 1024
  assert perf.flops_per_example(cfg, params, 1024, head_positions=0, pooled=True) == (
      pytest.approx(1024 * (expected - 6 * 50304 * 768) - 1023 * once))


def test_unknown_names_are_refused():
  with pytest.raises(ValueError, match="unknown benchmark presets"):
    benchmark.benchmark(["gpt3"], torch_side=False, warmup=0, steps=1)
  with pytest.raises(ValueError, match="FIELD=VALUE"):
    benchmark.parse_overrides(["nope=1"])
  assert benchmark.parse_overrides(["remat=full", "scan_layers=true", "num_layers=3"]) == {
      "remat": "full", "scan_layers": True, "num_layers": 3}


def test_fsdp_and_tensor_parallel_divide_the_state_over_devices():
  """On 8 (fake) devices: the computed shard bytes are what the state
  allocates, and FSDP over 8 holds <= 1/8 of the state (+10%) per device."""
  preset = presets.PRESETS["tiny_bert"]
  cfg = presets.model_config(preset, "float32")
  sizes = {m: footprint.state_bytes_per_device(preset, cfg, m)
           for m in footprint.MEMORY_MESHES}
  one = sizes[(1, 1, 1)]
  assert sizes[(8, 1, 1)] == one  # data parallel replicates the state
  assert sizes[(1, 8, 1)] <= one / 8 * 1.1
  assert sizes[(1, 4, 2)] <= one / 8 * 1.2
  # The real state, created into the (1, 4, 2) shardings, matches.
  from jaxtl.train import optim, sharding  # pylint: disable=g-import-not-at-top
  from jaxtl import train
  mesh = sharding.make_mesh((1, 4, 2))
  model, _, _ = presets.jaxtl_step(preset, cfg)
  tx, _ = optim.make_optimizer(presets.optimizer_config(), total_steps=1)
  batch = presets.make_batch(preset)
  state, _ = train.create_sharded_state(model, tx, train.lm_init_inputs(model, batch),
                                        jax.random.key(0), mesh, sharding.make_rules())
  per_device = {}
  for x in jax.tree.leaves(state):
    for shard in x.addressable_shards:
      per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
  assert max(per_device.values()) == sizes[(1, 4, 2)]


@pytest.mark.multiprocess
def test_pipeline_throughput_of_a_recipe(tmp_path):
  datadir.require_data("wikitext2")
  rows = footprint.pipeline_rows("pretrain_span", str(tmp_path), max_docs=3000, batches=3,
                                 workers=(0, 1))
  assert [r["stage"] for r in rows] == ["tokenize + pack", "objective, 0 Grain workers",
                                        "objective, 1 Grain workers"]
  # 3 batches of 32 rows x (128 inputs + their span-corruption targets).
  _, targets = corruption.span_corruption_lengths(128, 0.15, 3.0)
  assert rows[1]["tokens"] == rows[2]["tokens"] == f"{3 * 32 * (128 + targets):,}"
  assert all(float(r["tokens/s"].replace(",", "")) > 0 for r in rows)


def test_cpu_model_names_vendor_and_matmul_extensions(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
                  "model\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
                  "flags\t\t: fpu sse avx2 avx512f amx_tile amx_bf16\n\nprocessor\t: 1\n")
  assert perf.cpu_model(str(info)) == (
      "Intel(R) Xeon(R) Platinum 8481C (GenuineIntel family 6 model 143; "
      "avx2 avx512f amx_tile)")
  assert perf.cpu_model(str(tmp_path / "missing"))  # falls back to platform
