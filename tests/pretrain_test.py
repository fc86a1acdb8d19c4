"""Continued pretraining (``config.init_from``): from a jaxtl workdir it starts
exactly where the source stopped; from a Hugging Face BERT it takes the
architecture, the MLM head and the tokenizer; a family mismatch fails early.
BART, prefix-LM and NSP / SOP runs resume exactly."""

import filecmp
import glob
import json
import logging
import os
import shutil
import string

import numpy as np
import pytest
from flax import traverse_util

import runs
from jaxtl.pretraining import pretrain
from jaxtl.data.tokenizer_files import get_tokenizer
from jaxtl.train import checkpoint
from jaxtl.pretraining import pretrained as pretrained_lib

TEXT = "To be, or not to be: that is the question."


def _continued(init_from, **train_settings):
  config = runs.tiny_mlm_config()
  config.init_from = init_from
  config.train.update(**{**dict(steps=2, log_every=1, eval_every=2, eval_batches=1,
                                checkpoint_every=2), **train_settings})
  return config


@pytest.mark.slow
def test_a_continued_workdir_starts_from_the_sources_weights_and_tokenizer(
    pretrained, tmp_path):
  workdir = str(tmp_path)
  pretrain.train_and_evaluate(_continued(pretrained), workdir)
  source_eval = runs.logged_losses(pretrained, ("eval",))
  last = source_eval[max(source_eval)]
  # Same eval batches, same weights and LM head: the same loss before any step.
  assert runs.logged_losses(workdir, ("eval",))[("eval", 0)] == pytest.approx(last, rel=1e-5)
  # The source's sentencepiece model, copied: no tokenizer was trained.
  (model_file,) = glob.glob(os.path.join(pretrained, "tokenizer", "*.model"))
  copies = glob.glob(os.path.join(workdir, "tokenizer", "*"))
  assert [os.path.basename(c) for c in copies] == [os.path.basename(model_file)]
  assert filecmp.cmp(model_file, copies[0], shallow=False)
  again = pretrained_lib.load(workdir)  # what fine-tuning from it reads
  assert again.config == pretrained_lib.load_model_config(pretrained)
  assert again.tokenizer.encode(TEXT) == pretrained_lib.load(pretrained).tokenizer.encode(TEXT)


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  """A tiny random BertForMaskedLM with a character-level WordPiece vocab."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  chars = string.ascii_lowercase + string.digits
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(chars)
           + list(string.punctuation) + ["##" + c for c in chars] + ["the", "and"])
  folder = tmp_path_factory.mktemp("hf_bert")
  (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
  torch.manual_seed(0)
  config = transformers.BertConfig(
      vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=64)
  transformers.BertForMaskedLM(config).save_pretrained(folder)
  return str(folder)


@pytest.mark.slow
def test_continuing_a_bert_for_pretraining_with_nsp_loads_its_sentence_head(
    hf_bert, tmp_path, caplog):
  """BertForPreTraining's next-sentence head goes on training under mlm_nsp."""
  transformers = pytest.importorskip("transformers")
  folder = tmp_path / "bert_pretraining"
  folder.mkdir()
  shutil.copy(os.path.join(hf_bert, "vocab.txt"), folder)
  config = transformers.BertConfig.from_pretrained(hf_bert)
  transformers.BertForPreTraining(config).save_pretrained(folder)
  run = _continued(str(folder))
  run.objective.name = "mlm_nsp"
  with caplog.at_level(logging.INFO):
    metrics = pretrain.train_and_evaluate(run, str(tmp_path / "work"))
  assert "LM head: 5 tensors loaded" in caplog.text
  assert "; new []" in caplog.text  # the sentence head came from the source
  assert pretrained_lib.load(str(tmp_path / "work")).config.sentence_classes == 2
  assert 0 <= metrics["sentence_accuracy"] <= 1


@pytest.mark.slow
def test_continuing_a_hugging_face_bert_loads_its_mlm_head_and_tokenizer(
    hf_bert, tmp_path, caplog):
  workdir = str(tmp_path)
  with caplog.at_level(logging.INFO):
    pretrain.train_and_evaluate(_continued(hf_bert), workdir)
  assert "LM head: 5 tensors loaded" in caplog.text
  assert "training a" not in caplog.text  # no new tokenizer
  assert os.listdir(os.path.join(workdir, "tokenizer")) == ["tokenizer.json"]
  again = pretrained_lib.load(workdir)
  assert again.tokenizer.encode(TEXT) == get_tokenizer(hf_bert).encode(TEXT)
  source = pretrained_lib.load(hf_bert).config
  assert again.config == source.replace(dropout_rate=0.0, attention_dropout_rate=0.0)


def test_an_objective_of_another_family_fails_naming_both(hf_bert, tmp_path):
  config = _continued(hf_bert)
  config.objective.name = "clm"
  with pytest.raises(ValueError, match=r"objective 'clm' needs a 'decoder'.*"
                                       r"init_from=.* is 'encoder'"):
    pretrain.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


def _tiny_denoising_config(tmp, recipe, arg):
  """``recipe`` on a small synthetic corpus of sentences, with a tiny model,
  checkpointing every step."""
  import importlib  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  words = ["the cat", "a dog", "my friend", "the king", "sees", "likes", "finds",
           "calls", "follows", "the moon", "a river", "an old song", "the market",
           "!", "?"]
  text = "\n".join(" ".join(rng.choice(words, 6)) + " ." for _ in range(800))
  (tmp / "text.txt").write_text(text + "\n")
  config = importlib.import_module(f"jaxtl.configs.{recipe}").get_config(arg)
  config.data.source.files = dict(train=[str(tmp / "text.txt")],
                                  validation=[str(tmp / "text.txt")])
  config.data.tokenizer.update(vocab_size=160, model_type="bpe")
  config.data.update(seq_len=16, batch_size=8)
  config.model.update(num_layers=1, d_model=32, num_heads=2, head_dim=16, mlp_dim=64,
                      num_decoder_layers=1)
  config.optim.warmup_steps = 2
  config.train.update(steps=4, log_every=1, eval_every=4, eval_batches=1,
                      checkpoint_every=2, keep_checkpoints=4)
  return config


@pytest.mark.slow
@pytest.mark.parametrize("recipe,arg", [("pretrain_bart", None),
                                        ("pretrain_prefix_lm", None),
                                        ("pretrain_prefix_lm", "model=bart_tiny")])
def test_new_objectives_resume_exactly_after_a_kill(recipe, arg, tmp_path):
  """bart, prefix_lm and prefix_lm_encdec: a run killed after its step-2
  checkpoint (the later ones removed, as a kill leaves it) and run again
  logs the uninterrupted run's losses and ends with its parameters."""
  config = _tiny_denoising_config(tmp_path, recipe, arg)
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "killed")
  pretrain.train_and_evaluate(config, ref_dir)
  shutil.copytree(ref_dir, workdir)
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  for step in runs.checkpoint_steps(workdir):
    if step > 2:
      shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
  pretrain.train_and_evaluate(config, workdir)
  ref, resumed = runs.logged_losses(ref_dir), runs.logged_losses(workdir)
  assert sorted(resumed) == sorted(k for k in ref if k[1] > 2)
  assert resumed == {k: ref[k] for k in resumed}
  flat = lambda d: traverse_util.flatten_dict(checkpoint.load_params(d), sep="/")
  ref_params, resumed_params = flat(ref_dir), flat(workdir)
  for name, value in ref_params.items():
    np.testing.assert_array_equal(resumed_params[name], value, err_msg=name)


@pytest.mark.slow
def test_a_run_trained_for_longer_says_its_learning_rate_moved(tmp_path, caplog):
  """A finished run resumed with more steps stretches its schedule over
  them: the resume says the rate it had and has now, and why. A rerun
  of the same settings says nothing."""
  config = _tiny_denoising_config(tmp_path, "pretrain_prefix_lm", None)
  config.train.update(steps=3, eval_every=3, checkpoint_every=3)
  workdir = str(tmp_path / "wd")
  pretrain.train_and_evaluate(config, workdir)
  caplog.set_level(logging.WARNING)
  pretrain.train_and_evaluate(config, workdir)  # finished: it only evaluates
  assert "learning rate" not in caplog.text
  config.train.steps = 5
  pretrain.train_and_evaluate(config, workdir)
  # lr 1e-3 after 2 warmup steps, decaying to 1e-4 at step 3, now at step 5
  assert ("resuming at step 3 with a learning rate of 0.000775, not the 0.0001 of the "
          "checkpoint: the run now has 5 steps, not the 3 it was started with") in caplog.text


def _sentence_pair_config(objective):
  config = runs.tiny_mlm_config()  # one line of Shakespeare per document
  config.objective.name = objective
  config.model.update(sentence_classes=2)
  config.optim.update(warmup_steps=2)
  config.train.update(steps=4, log_every=1, eval_every=4, eval_batches=1,
                      checkpoint_every=2, keep_checkpoints=4)
  return config


def _records(workdir, key):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {(r["split"], r["step"]): r[key] for r in map(json.loads, f)
            if r["split"] in ("train", "eval")}


@pytest.mark.slow
@pytest.mark.mesh  # pretraining sharded end to end, state restored onto 8 devices
@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm_sop"])
def test_a_sentence_pair_run_stopped_after_a_checkpoint_resumes_exactly(
    objective, tmp_path):
  """As if killed right after step 2's checkpoint (the later ones removed):
  the same MLM and sentence losses and the same final weights."""
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "resumed")
  pretrain.train_and_evaluate(_sentence_pair_config(objective), ref_dir)
  shutil.copytree(ref_dir, workdir)
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  for step in runs.checkpoint_steps(workdir):
    if step > 2:
      shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
  pretrain.train_and_evaluate(_sentence_pair_config(objective), workdir)
  for key in ("loss", "sentence_loss", "sentence_accuracy"):
    ref, resumed = _records(ref_dir, key), _records(workdir, key)
    assert sorted(resumed) == sorted(k for k in ref if k[1] > 2)
    assert resumed == {k: ref[k] for k in resumed}, key
  ref_params, params = (traverse_util.flatten_dict(checkpoint.load_params(d), sep="/")
                        for d in (ref_dir, workdir))
  assert "sentence_head/out/kernel" in params
  for name, value in ref_params.items():
    np.testing.assert_array_equal(params[name], value, err_msg=name)
  # Fine-tuning with pooling="pooler" starts from the pooler it trained.
  head = pretrained_lib.load(workdir).head
  np.testing.assert_array_equal(head["pooler"]["kernel"],
                                params["sentence_head/pooler/kernel"])
