"""Fine-tuned TaskModels exported as Hugging Face folders: the stock task
class where one computes the same, else the stock backbone plus jaxtl's head
class (modeling_jaxtl.py, loaded with trust_remote_code). Every (family,
kind, pooling, scalar mix, adapters) loads with no missing or unexpected keys
and gives jaxtl's outputs on a right-padded batch; what has no equivalent is
refused by name."""

import os
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxtl import convert  # pylint: disable=g-import-not-at-top,wrong-import-position
from jaxtl.convert import bart, bert, distilbert, electra, gpt2, remote_code, roberta, t5  # pylint: disable=g-import-not-at-top,wrong-import-position
from jaxtl.models.heads import TaskModel  # pylint: disable=g-import-not-at-top,wrong-import-position

TOL = 1e-4
VOCAB, PAD, EOS = 61, 0, 1
# Tiny configs that HF's classes can express, odd sizes (3 heads, width 24).
CONFIGS = {
    "bert": bert.config_from_hf(dict(
        vocab_size=VOCAB, hidden_size=24, num_attention_heads=3, intermediate_size=40,
        num_hidden_layers=2, max_position_embeddings=16)),
    "gpt2": gpt2.config_from_hf(dict(vocab_size=VOCAB, n_embd=24, n_head=3,
                                     n_layer=2, n_positions=16)),
    "t5": t5.config_from_hf(dict(vocab_size=VOCAB, d_model=24, d_kv=8, d_ff=40,
                                 num_layers=2, num_heads=3,
                                 relative_attention_num_buckets=8)),
    "roberta": roberta.config_from_hf(dict(
        vocab_size=VOCAB, hidden_size=24, num_attention_heads=3, intermediate_size=40,
        num_hidden_layers=2, max_position_embeddings=18, type_vocab_size=1)),
    "electra": electra.config_from_hf(dict(  # ELECTRA-small's narrower table
        vocab_size=VOCAB, embedding_size=14, hidden_size=24, num_attention_heads=3,
        intermediate_size=40, num_hidden_layers=2, max_position_embeddings=16)),
    "distilbert": distilbert.config_from_hf(dict(
        vocab_size=VOCAB, dim=24, n_heads=3, hidden_dim=40, n_layers=2,
        max_position_embeddings=16)),
    "bart": bart.config_from_hf(dict(
        vocab_size=VOCAB, d_model=24, encoder_attention_heads=3,
        decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40,
        encoder_layers=2, decoder_layers=1, max_position_embeddings=16)),
}
LABELS = ["negative", "positive", "neutral"]
# A decoder's tokenizer as the pad-id check reads it (jaxtl's SentencePiece ids).
TOKENIZER = types.SimpleNamespace(pad_id=PAD, eos_id=EOS)
AUTO = {"BertForSequenceClassification": "AutoModelForSequenceClassification",
        "GPT2ForSequenceClassification": "AutoModelForSequenceClassification",
        "BertForTokenClassification": "AutoModelForTokenClassification",
        "GPT2ForTokenClassification": "AutoModelForTokenClassification",
        "BertForQuestionAnswering": "AutoModelForQuestionAnswering",
        "GPT2ForQuestionAnswering": "AutoModelForQuestionAnswering",
        "T5ForTokenClassification": "AutoModelForTokenClassification",
        "RobertaForSequenceClassification": "AutoModelForSequenceClassification",
        "RobertaForTokenClassification": "AutoModelForTokenClassification",
        "DistilBertForTokenClassification": "AutoModelForTokenClassification",
        "ElectraForTokenClassification": "AutoModelForTokenClassification",
        "DistilBertForQuestionAnswering": "AutoModelForQuestionAnswering",
        "T5ForConditionalGeneration": "AutoModelForSeq2SeqLM",
        "GPT2LMHeadModel": "AutoModelForCausalLM",
        **{cls: auto for cls, auto in remote_code.HEAD_CLASSES.values()}}


def _spec(kind, pooling="", labels=None, scalar_mix=False):
  return types.SimpleNamespace(name="t", kind=kind, label_names=labels, pooling=pooling,
                               max_len=16, family="", scalar_mix=scalar_mix,
                               label_words=None, head_dropout=0.1)


def _batch():
  """Two rows of 7 tokens, the second right-padded (with the pad id) after 4;
  rows end with EOS, as jaxtl frames a decoder's inputs."""
  ids = np.random.RandomState(0).randint(2, VOCAB, (2, 7))
  mask = np.ones_like(ids)
  mask[1, 4:] = 0
  ids[0, -1], ids[1, 3] = EOS, EOS
  return np.where(mask > 0, ids, PAD), mask


def _task_model(family, kind, *, cfg=None, **kw):
  """A TaskModel with random parameters, every leaf perturbed (biases, norms
  and LoRA's B start at constants that would hide mistakes)."""
  num_labels = len(kw.pop("labels", LABELS))
  model = TaskModel(cfg or CONFIGS[family], kind=kind, num_labels=num_labels,
                    dropout_rate=0.1, **kw)
  ids, _ = _batch()
  params = nn.unbox(model.init(jax.random.key(0), jnp.asarray(ids)))["params"]
  # numpy noise: jax.random per leaf shape would compile a program each.
  rng = np.random.RandomState(1)
  return model, jax.tree.map(lambda x: np.asarray(x) + 0.1 * rng.normal(
      size=x.shape).astype(np.float32), params)


def _load(folder, arch, auto=None):
  """The folder's model by its auto class; jaxtl's classes by remote code."""
  model, info = getattr(transformers, auto or AUTO[arch]).from_pretrained(
      folder, output_loading_info=True, trust_remote_code=arch.startswith("Jaxtl"))
  assert type(model).__name__ == arch
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return model.eval()


def _compare(model, params, hf_model, kind, family):
  """jaxtl's outputs and the Hugging Face model's agree on a right-padded batch."""
  ids, mask = _batch()
  if family == "roberta":  # its positions count the tokens that are not id 1
    ids = np.where(ids == roberta.PAD_ID, 2, ids)
  ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
  with torch.no_grad():
    out = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask))
  if kind == "span_qa":
    theirs = torch.stack([out.start_logits, out.end_logits], -1).numpy()
  else:
    theirs = out.logits.numpy()[..., 0] if kind == "regression" else out.logits.numpy()
  valid = mask.astype(bool) if ours.ndim == 3 else slice(None)  # padding: undefined
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=TOL)


def _labels(kind):
  return LABELS if kind in ("classification", "token_classification") else None


def _check_config(config, kind):
  """id2label / label2id, num_labels and problem_type, as HF's classes read them."""
  labels = _labels(kind)
  if labels:
    assert config.id2label == dict(enumerate(labels))
    assert config.label2id == {n: i for i, n in enumerate(labels)}
  if kind in ("classification", "regression"):
    assert config.num_labels == (3 if labels else 1)
    assert config.problem_type == {"classification": "single_label_classification",
                                   "regression": "regression"}[kind]


@pytest.mark.slow
@pytest.mark.parametrize("family,kind,pooling,arch", [
    ("bert", "classification", "pooler", "BertForSequenceClassification"),
    ("bert", "regression", "pooler", "BertForSequenceClassification"),
    ("bert", "token_classification", "", "BertForTokenClassification"),
    ("bert", "span_qa", "", "BertForQuestionAnswering"),
    ("gpt2", "classification", "last", "GPT2ForSequenceClassification"),
    ("gpt2", "regression", "last", "GPT2ForSequenceClassification"),
    ("gpt2", "token_classification", "", "GPT2ForTokenClassification"),
    ("gpt2", "span_qa", "", "GPT2ForQuestionAnswering"),
    ("t5", "token_classification", "", "T5ForTokenClassification"),
    ("roberta", "classification", "pooler", "RobertaForSequenceClassification"),
    ("roberta", "token_classification", "", "RobertaForTokenClassification"),
    ("distilbert", "token_classification", "", "DistilBertForTokenClassification"),
    ("distilbert", "span_qa", "", "DistilBertForQuestionAnswering"),
    ("electra", "token_classification", "", "ElectraForTokenClassification"),
])
def test_task_heads_match_transformers(family, kind, pooling, arch, tmp_path):
  model, params = _task_model(family, kind, pooling=pooling or "first")
  assert convert.export_task_hf(tmp_path, CONFIGS[family], params,
                                _spec(kind, pooling, _labels(kind)), tokenizer=TOKENIZER,
                                model_type=family) == arch
  assert not (tmp_path / remote_code.MODELING_FILE).exists()  # no remote code
  hf_model = _load(tmp_path, arch)
  _compare(model, params, hf_model, kind, family)
  # And back: the head's classifier is imported as the head's ``out``
  # (GPT-2's score without its bias, which the export moved into ln_f).
  again = convert.import_hf(tmp_path).head["out"]
  np.testing.assert_array_equal(again["kernel"], params["head"]["out"]["kernel"])
  assert ("bias" in again) == (arch != "GPT2ForSequenceClassification")
  _check_config(hf_model.config, kind)


# A decoder's tokenizer whose pad id is its EOS (GPT-2's own BPE).
PAD_IS_EOS = types.SimpleNamespace(pad_id=EOS, eos_id=EOS)


@pytest.mark.parametrize("family,kind,pooling,how", [
    # Every pooling BERT's classifier (its pooler) does not compute.
    ("bert", "classification", "first", ""),
    ("bert", "classification", "last", ""),
    ("bert", "classification", "mean", ""),
    ("bert", "classification", "concat", ""),
    ("bert", "regression", "pooler", "scalar_mix"),
    ("bert", "token_classification", "", "scalar_mix"),
    ("bert", "span_qa", "", "adapters"),
    ("gpt2", "classification", "mean", ""),  # the decoder's default pooling
    ("gpt2", "classification", "last", "pad_is_eos"),  # HF's would skip the EOS
    ("gpt2", "regression", "concat", "adapters"),
    ("t5", "classification", "mean", ""),  # heads on the encoder: T5EncoderModel
    ("t5", "span_qa", "", "scalar_mix"),
    ("bart", "classification", "first", "adapters"),  # on BartEncoder
    ("distilbert", "classification", "mean", ""),
    ("electra", "regression", "pooler", ""),
    ("roberta", "token_classification", "", "scalar_mix"),
])
def test_what_no_stock_class_computes_is_its_backbone_and_jaxtls_head(
    family, kind, pooling, how, tmp_path):
  cfg = CONFIGS[family].replace(adapter_dim=4 if how == "adapters" else 0)
  model, params = _task_model(family, kind, cfg=cfg, pooling=pooling or "first",
                              scalar_mix=how == "scalar_mix")
  spec = _spec(kind, pooling, _labels(kind), scalar_mix=how == "scalar_mix")
  arch = convert.export_task_hf(tmp_path, cfg, params, spec, model_type=family,
                                tokenizer=PAD_IS_EOS if how == "pad_is_eos" else TOKENIZER)
  assert arch == remote_code.HEAD_CLASSES[kind][0]
  hf_model = _load(tmp_path, arch)
  # The stock config under jaxtl's model type, which only the file loads.
  assert hf_model.config.model_type == remote_code.MODEL_TYPE
  assert type(hf_model.config).__base__.model_type == family
  _compare(model, params, hf_model, kind, family)
  _check_config(hf_model.config, kind)


def test_the_modeling_file_needs_torch_and_transformers_alone(tmp_path):
  import ast  # pylint: disable=g-import-not-at-top
  model, params = _task_model("t5", "classification", pooling="mean")
  convert.export_task_hf(tmp_path, CONFIGS["t5"], params,
                         _spec("classification", "mean", LABELS))
  source = (tmp_path / remote_code.MODELING_FILE).read_text()
  assert 'BACKBONE = "T5EncoderModel"' in source
  imported = {a.name.split(".")[0] for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Import) for a in node.names}
  imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ImportFrom)}
  assert imported == {"importlib", "inspect", "torch", "transformers"}


def test_lora_is_merged_before_export(tmp_path):
  cfg = CONFIGS["bert"].replace(lora_rank=2)
  model, params = _task_model("bert", "token_classification", cfg=cfg)
  assert "query_lora_b" in params["backbone"]["stack"]["layer_0"]["self_attention"]
  convert.export_task_hf(tmp_path, cfg, params, _spec("token_classification"))
  hf_model = _load(tmp_path, "BertForTokenClassification")
  ids, mask = _batch()
  ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
  with torch.no_grad():
    theirs = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(ours[mask > 0], theirs[mask > 0], atol=TOL)


@pytest.mark.slow
def test_t5_text_to_text_is_its_lm(tmp_path):
  """Rank classification: HF's label log-likelihoods equal the TaskModel's."""
  targets = ((5, 6, EOS), (7, EOS, PAD))
  model, params = _task_model("t5", "text_to_text", label_tokens=targets, pad_id=PAD)
  arch = convert.export_task_hf(tmp_path, CONFIGS["t5"], params,
                                _spec("text_to_text", labels=["yes", "no"]))
  hf_model = _load(tmp_path, arch)
  ids, mask = _batch()
  ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
  t = torch.tensor(targets)
  theirs = np.zeros_like(ours)
  for c in range(len(targets)):
    labels = t[c:c + 1].repeat(2, 1)
    with torch.no_grad():
      logits = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                        decoder_input_ids=hf_model.prepare_decoder_input_ids_from_labels(
                            labels)).logits
    logp = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    theirs[:, c] = (logp * (labels != PAD)).sum(-1).numpy()
  np.testing.assert_allclose(ours, theirs, atol=TOL)


@pytest.mark.slow
@pytest.mark.parametrize("family,arch,adapters", [
    ("t5", "T5ForConditionalGeneration", False), ("gpt2", "GPT2LMHeadModel", False),
    ("t5", "T5ForConditionalGeneration", True), ("gpt2", "GPT2LMHeadModel", True)])
def test_a_generation_model_is_exported_as_its_lm(family, arch, adapters, tmp_path):
  """The next-token distribution of the first output token is HF's: after
  the start token (T5, whose decoder starts from pad) or after the input.
  With adapters, the LM is the stock class plus them (JaxtlAdaptedLM)."""
  cfg = CONFIGS[family].replace(adapter_dim=4 if adapters else 0)
  model, params = _task_model(family, "generation", cfg=cfg, pad_id=PAD)
  written = convert.export_task_hf(tmp_path, cfg, params, _spec("generation"),
                                   tokenizer=TOKENIZER)
  assert written == (remote_code.ADAPTED_LM if adapters else arch)
  hf_model = _load(tmp_path, written, AUTO[arch])
  assert isinstance(hf_model, getattr(transformers, arch))  # generate() and all
  ids, mask = _batch()
  ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
  with torch.no_grad():
    if family == "t5":
      theirs = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                        decoder_input_ids=torch.full((2, 1), PAD)).logits[:, 0]
    else:
      logits = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
      theirs = logits[torch.arange(2), torch.tensor(mask.sum(-1) - 1)]
  np.testing.assert_allclose(ours, theirs.numpy(), atol=TOL)


@pytest.mark.parametrize("family,cfg,params,spec,match", [
    ("bert", {}, {}, _spec("generation"),
     r"fine-tuned for 'generation' has no Hugging Face bert class"),
    ("t5", {}, {}, _spec("text_to_text", scalar_mix=True), "with a scalar mix"),
    ("bert", {}, {"probe": {}}, _spec("span_qa"), r"no Hugging Face place: \['probe'\]"),
    ("bert", {"pre_norm": True}, {}, _spec("classification", "mean"),
     "no Hugging Face bert equivalent: pre_norm=True"),
])
def test_what_has_no_hugging_face_equivalent_is_refused(family, cfg, params, spec, match,
                                                         tmp_path):
  with pytest.raises(ValueError, match=match):
    convert.export_task_hf(tmp_path, CONFIGS[family].replace(**cfg),
                           {"backbone": {}, "head": {}, **params}, spec,
                           tokenizer=TOKENIZER, model_type=family)
  assert not os.listdir(tmp_path)


def _workdir(tmp_path, pooling):
  """A fine-tuning workdir as fine-tuning leaves one (task.json, tokenizer/,
  model_config.json, best/) around a random TaskModel on the BERT config,
  with a WordPiece tokenizer of words ``w0`` .. ``w55``; and that model."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from jaxtl import layout  # pylint: disable=g-import-not-at-top
  from jaxtl.data import hf_tokenizers  # pylint: disable=g-import-not-at-top
  from jaxtl.data.tokenizer_files import save_tokenizer  # pylint: disable=g-import-not-at-top
  from jaxtl.tasks import spec  # pylint: disable=g-import-not-at-top
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "work"
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + [f"w{i}" for i in range(VOCAB - 5)]))
  save_tokenizer(hf_tokenizers.HuggingFaceTokenizer.wordpiece(vocab),
                 workdir / layout.TOKENIZER_DIR)
  pretrained.save_model_config(CONFIGS["bert"], str(workdir))
  spec.save(spec.TaskSpec(name="t", kind="classification", label_names=tuple(LABELS),
                          pooling=pooling, max_len=16, family="encoder"), str(workdir))
  model, params = _task_model("bert", "classification", pooling=pooling)
  ocp.PyTreeCheckpointer().save(workdir / "best" / "7" / "state",
                                {"params": jax.tree.map(np.asarray, params)})
  return workdir, model, params


def _convert(*flags):
  """``jaxtl convert``'s main with ``flags``."""
  from jaxtl.programs import export as cli  # pylint: disable=g-import-not-at-top
  cli.FLAGS([sys.argv[0], *flags])
  try:
    cli.main([])
  finally:
    cli.FLAGS.unparse_flags()


@pytest.mark.slow
def test_cli_exports_a_finetuning_workdir(tmp_path):
  """The command on a workdir with task.json and best/; the folder's
  tokenizer loads in ``transformers`` too."""
  workdir, model, params = _workdir(tmp_path, "pooler")
  out = tmp_path / "hf"
  _convert(f"--checkpoint={workdir}", f"--out={out}")
  hf_model = _load(out, "BertForSequenceClassification")
  assert hf_model.config.id2label == dict(enumerate(LABELS))
  tok = transformers.AutoTokenizer.from_pretrained(out)
  enc = tok(["w3 w7 w2", "w5"], padding=True, return_tensors="pt")
  with torch.no_grad():
    theirs = hf_model(enc["input_ids"], attention_mask=enc["attention_mask"]).logits
  ours = model.apply({"params": params}, jnp.asarray(enc["input_ids"].numpy()),
                     jnp.asarray(enc["attention_mask"].numpy()))
  np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=TOL)


def test_an_exported_pipeline_gives_jaxtls_labels_and_probabilities(tmp_path):
  """jaxtl.load(workdir).predict equals transformers' text-classification
  pipeline on the export of a mean-pooling model (a head no stock class has),
  the loading code the command's help gives."""
  import jaxtl  # pylint: disable=g-import-not-at-top
  workdir, _, _ = _workdir(tmp_path, "mean")
  out = tmp_path / "hf"
  _convert(f"--checkpoint={workdir}", f"--out={out}")
  texts = ["w3 w7 w2", "w5", "w11 w12 w13 w14 w40 w41", "w9 w9"]
  ours = jaxtl.load(str(workdir)).predict(texts)
  classify = transformers.pipeline("text-classification", model=str(out),
                                   trust_remote_code=True, top_k=None)
  for mine, theirs in zip(ours, classify(texts)):
    assert theirs[0]["label"] == mine["label"]
    scores = {t["label"]: t["score"] for t in theirs}
    np.testing.assert_allclose([scores[n] for n in LABELS],
                               [mine["probabilities"][n] for n in LABELS], atol=TOL)
  # Batched: the tokenizer pads with the special tokens tokenizer_config.json names.
  batched = classify(texts, batch_size=4)
  assert [b[0]["label"] for b in batched] == [m["label"] for m in ours]
  # Without trust_remote_code transformers stops and asks for it, rather
  # than load a stock BERT with a random head (model_type is jaxtl's own).
  with pytest.raises(ValueError, match="trust_remote_code"):
    transformers.AutoModelForSequenceClassification.from_pretrained(str(out))
  # Nor does jaxtl import it as a backbone: its workdir is the way back.
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"a jaxtl export with a head of jaxtl's own"):
    pretrained.load(str(out))
