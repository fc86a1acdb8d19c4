"""Fine-tuned TaskModels exported as Hugging Face task classes: every
supported (family, kind) loads with no missing or unexpected keys and gives
jaxtl's outputs on a right-padded batch; the rest are refused by name."""

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
from jaxtl.convert import bert, distilbert, electra, gpt2, roberta, t5  # pylint: disable=g-import-not-at-top,wrong-import-position
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
        "GPT2LMHeadModel": "AutoModelForCausalLM"}


def _spec(kind, pooling="", labels=None, scalar_mix=False):
  return types.SimpleNamespace(name="t", kind=kind, label_names=labels, pooling=pooling,
                               max_len=16, family="", scalar_mix=scalar_mix,
                               label_words=None)


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


def _load(folder, arch):
  model, info = getattr(transformers, AUTO[arch]).from_pretrained(
      folder, output_loading_info=True)
  assert type(model).__name__ == arch
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return model.eval()


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
  labels = LABELS if kind in ("classification", "token_classification") else None
  model, params = _task_model(family, kind, pooling=pooling or "first")
  assert convert.export_task_hf(tmp_path, CONFIGS[family], params,
                                _spec(kind, pooling, labels), tokenizer=TOKENIZER,
                                model_type=family) == arch
  hf_model = _load(tmp_path, arch)
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
  # And back: the head's classifier is imported as the head's ``out``
  # (GPT-2's score without its bias, which the export moved into ln_f).
  again = convert.import_hf(tmp_path).head["out"]
  np.testing.assert_array_equal(again["kernel"], params["head"]["out"]["kernel"])
  assert ("bias" in again) == (arch != "GPT2ForSequenceClassification")
  config = hf_model.config
  if labels:
    assert config.id2label == dict(enumerate(labels))
    assert config.label2id == {n: i for i, n in enumerate(labels)}
  if kind in ("classification", "regression"):
    assert config.num_labels == (3 if labels else 1)
    assert config.problem_type == {"classification": "single_label_classification",
                                   "regression": "regression"}[kind]


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


@pytest.mark.parametrize("family,arch", [("t5", "T5ForConditionalGeneration"),
                                         ("gpt2", "GPT2LMHeadModel")])
def test_a_generation_model_is_exported_as_its_lm(family, arch, tmp_path):
  """The next-token distribution of the first output token is HF's: after
  the start token (T5, whose decoder starts from pad) or after the input."""
  model, params = _task_model(family, "generation", pad_id=PAD)
  assert convert.export_task_hf(tmp_path, CONFIGS[family], params, _spec("generation"),
                                tokenizer=TOKENIZER) == arch
  hf_model = _load(tmp_path, arch)
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


@pytest.mark.parametrize("family,spec,match", [
    ("bert", _spec("classification", "first"),
     r"pools dense \+ tanh over \[CLS\].*pooling='first'.*task.pooling='pooler'"),
    ("bert", _spec("classification", "mean"), "pooling='mean'"),
    ("gpt2", _spec("regression", "mean"), "last token that is not pad_token_id"),
    ("gpt2", _spec("classification", ""), "pooling='mean'"),  # the decoder default
    ("gpt2", _spec("classification", "concat"), "pooling='concat'.*task.pooling='last'"),
    ("t5", _spec("classification", "mean"), r"exportable kinds: \['generation', 'text_to_text', 'token_classification'\]"),
    ("bert", _spec("classification", "pooler", scalar_mix=True), "scalar mix"),
    ("distilbert", _spec("classification", "pooler"),
     r"exportable kinds: \['span_qa', 'token_classification'\]"),
    ("electra", _spec("classification", "pooler"),  # a narrower table: not BERT's
     r"no Hugging Face electra class.*exportable kinds: \['span_qa', 'token_class"),
])
def test_what_hf_cannot_compute_is_refused(family, spec, match, tmp_path):
  with pytest.raises(ValueError, match=match):
    convert.export_task_hf(tmp_path, CONFIGS[family], {"backbone": {}, "head": {}},
                           spec, tokenizer=TOKENIZER)
  assert not os.listdir(tmp_path)


def test_adapters_and_shared_pad_eos_are_refused(tmp_path):
  with pytest.raises(ValueError, match="adapters"):
    convert.export_task_hf(tmp_path, CONFIGS["bert"].replace(adapter_dim=4),
                           {"backbone": {}}, _spec("span_qa"))
  gpt2_bpe = types.SimpleNamespace(pad_id=EOS, eos_id=EOS)
  with pytest.raises(ValueError, match="pad id 1 is also its EOS"):
    convert.export_task_hf(tmp_path, CONFIGS["gpt2"], {"backbone": {}},
                           _spec("classification", "last"), tokenizer=gpt2_bpe)


def test_cli_exports_a_finetuning_workdir(tmp_path):
  """``python -m jaxtl.convert``'s main on a workdir with task.json and best/;
  the folder's tokenizer loads in ``transformers`` too."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from jaxtl.data import hf_tokenizers, pipeline  # pylint: disable=g-import-not-at-top
  from jaxtl.data.tokenizer_files import save_tokenizer  # pylint: disable=g-import-not-at-top
  from jaxtl.train import pretrained  # pylint: disable=g-import-not-at-top
  workdir, out = tmp_path / "work", tmp_path / "hf"
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + [f"w{i}" for i in range(VOCAB - 5)]))
  save_tokenizer(hf_tokenizers.HuggingFaceTokenizer.wordpiece(vocab),
                 workdir / pipeline.TOKENIZER_DIR)
  cfg = CONFIGS["bert"]
  pretrained.save_model_config(cfg, str(workdir))
  from jaxtl.tasks import spec  # pylint: disable=g-import-not-at-top
  spec.save(spec.TaskSpec(name="t", kind="classification", label_names=tuple(LABELS),
                          pooling="pooler", max_len=16, family="encoder"), str(workdir))
  model, params = _task_model("bert", "classification", pooling="pooler")
  ocp.PyTreeCheckpointer().save(workdir / "best" / "7" / "state",
                                {"params": jax.tree.map(np.asarray, params)})
  from jaxtl.convert import __main__ as cli  # pylint: disable=g-import-not-at-top
  cli.FLAGS([sys.argv[0], f"--checkpoint={workdir}", f"--out={out}"])
  try:
    cli.main([])
  finally:
    cli.FLAGS.unparse_flags()
  hf_model = _load(out, "BertForSequenceClassification")
  assert hf_model.config.id2label == dict(enumerate(LABELS))
  tok = transformers.AutoTokenizer.from_pretrained(out)
  enc = tok(["w3 w7 w2", "w5"], padding=True, return_tensors="pt")
  with torch.no_grad():
    theirs = hf_model(enc["input_ids"], attention_mask=enc["attention_mask"]).logits
  ours = model.apply({"params": params}, jnp.asarray(enc["input_ids"].numpy()),
                     jnp.asarray(enc["attention_mask"].numpy()))
  np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=TOL)
