"""Generation: the KV cache equals recomputing the prefix, greedy decoding
matches transformers token for token, sampling and beam-search properties."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtl.decoding import generate as G
from jaxtl.models import TransformerConfig, build_model

DECODER = TransformerConfig(family="decoder", vocab_size=61, d_model=32, num_heads=4,
                            head_dim=8, mlp_dim=64, num_layers=2, max_len=64,
                            dropout_rate=0.0)
T5 = TransformerConfig(family="encoder_decoder", vocab_size=61, d_model=32, num_heads=4,
                       head_dim=8, mlp_dim=64, num_layers=2, max_len=64,
                       position="relative", norm="rmsnorm", use_bias=False,
                       scale_attention=False, dropout_rate=0.0, relative_buckets=8,
                       relative_max_distance=16)
# BART's layers: learned positions per stack, post-LN, an embedding norm.
BART = T5.replace(position="learned", norm="layernorm", norm_eps=1e-5, use_bias=True,
                  scale_attention=True, pre_norm=False, embed_norm=True,
                  lm_head_bias=True)


def _params(cfg, seed=0):
  tokens = jnp.ones((1, 4), jnp.int32)
  args = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  params = build_model(cfg).init(jax.random.key(seed), *args)["params"]
  # Sharper distributions than the init's, so greedy paths are not ties.
  return jax.tree.map(lambda x: x * 3.0 if x.ndim == 2 and x.shape[0] == 61 else x, params)


def _naive_greedy(cfg, params, tokens, n, eos=None, pad=0):
  """Greedy decoding that recomputes the whole prefix every step.

  The sequence lives in a fixed-size buffer, so the model compiles once; the
  positions after the prefix hold padding, which a causal decoder ignores.
  """
  model = build_model(cfg)
  batch, done = len(tokens), np.zeros(len(tokens), bool)
  if cfg.family == "decoder":
    start = tokens.shape[1]
    seq = np.concatenate([tokens, np.zeros((batch, n), np.int32)], 1)
    logits_fn = jax.jit(lambda s: model.apply({"params": params}, s)["logits"])
  else:
    start, seq = 1, np.zeros((batch, n + 1), np.int32)
    logits_fn = jax.jit(lambda s: model.apply({"params": params}, tokens, s)["logits"])
  for t in range(start, start + n):
    tok = np.where(done, pad, np.asarray(jnp.argmax(logits_fn(seq)[:, t - 1], -1)))
    if eos is not None:
      done |= tok == eos
    seq[:, t] = tok
  return seq[:, start:]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [DECODER, T5, DECODER.replace(scan_layers=True),
                                 T5.replace(scan_layers=True), BART,
                                 DECODER.replace(row_major_dots=True)],
                         ids=["decoder", "t5", "decoder_scan", "t5_scan", "bart",
                              "decoder_row_major"])
def test_cached_greedy_equals_recomputing_the_prefix(cfg):
  params = _params(cfg)
  tokens = np.random.RandomState(0).randint(2, 61, (3, 5))
  gen = G.GenerationConfig(max_new_tokens=6, eos_id=5)
  got = G.generate(cfg, params, tokens, gen=gen)
  np.testing.assert_array_equal(got, _naive_greedy(cfg, params, tokens, 6, eos=5))


def test_left_padding_does_not_change_a_prompt_s_output():
  params = _params(DECODER)
  short, long_ = [7, 8, 9], [3, 4, 5, 6, 7]
  tokens = np.array([[0, 0] + short, long_])
  mask = np.array([[0, 0, 1, 1, 1], [1] * 5])
  gen = G.GenerationConfig(max_new_tokens=6)
  both = G.generate(DECODER, params, tokens, mask, gen=gen)
  alone = G.generate(DECODER, params, np.array([short]), gen=gen)
  np.testing.assert_array_equal(both[0], alone[0])


@pytest.mark.slow
def test_sampling_settings():
  params = _params(DECODER)
  tokens = np.random.RandomState(1).randint(2, 61, (2, 5))
  greedy = G.generate(DECODER, params, tokens, gen=G.GenerationConfig(max_new_tokens=8))
  top1 = G.generate(DECODER, params, tokens, gen=G.GenerationConfig(
      max_new_tokens=8, temperature=1.0, top_k=1), rng=jax.random.key(3))
  np.testing.assert_array_equal(top1, greedy)
  gen = G.GenerationConfig(max_new_tokens=8, temperature=1.5, num_return_sequences=4)
  a = G.generate(DECODER, params, tokens, gen=gen, rng=jax.random.key(1))
  b = G.generate(DECODER, params, tokens, gen=gen, rng=jax.random.key(1))
  assert a.shape == (8, 8)
  np.testing.assert_array_equal(a, b)
  assert len({tuple(r) for r in a[:4]}) > 1  # the 4 samples of prompt 0 differ


def test_process_logits_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  seen = jnp.zeros((1, 4), bool)
  keep = lambda gen: np.isfinite(np.asarray(G.process_logits(logits, seen, gen))) & (
      np.asarray(G.process_logits(logits, seen, gen)) > -1e30)
  assert keep(G.GenerationConfig(top_k=2)).tolist() == [[True, True, False, False]]
  assert keep(G.GenerationConfig(top_p=0.7)).tolist() == [[True, True, False, False]]
  assert keep(G.GenerationConfig(top_p=0.5)).tolist() == [[True, False, False, False]]
  penalized = G.process_logits(jnp.array([[2.0, -2.0, 2.0]]), jnp.array([[True, True, False]]),
                               G.GenerationConfig(repetition_penalty=2.0))
  np.testing.assert_allclose(penalized, [[1.0, -4.0, 2.0]])


def test_ids_past_the_tokenizers_are_never_chosen():
  # A jaxtl model's table is padded past its tokenizer's ids (to a multiple of
  # 128); a barely trained model can rank a padding row first, and no
  # tokenizer decodes it.
  params = _params(DECODER)
  tokens = np.random.RandomState(4).randint(2, 61, (4, 5))
  free = G.generate(DECODER, params, tokens, gen=G.GenerationConfig(max_new_tokens=12))
  assert free.max() >= 30  # the unbounded model picks such ids here
  for gen in (G.GenerationConfig(max_new_tokens=12, vocab_size=30),
              G.GenerationConfig(max_new_tokens=12, vocab_size=30, temperature=2.0)):
    assert G.generate(DECODER, params, tokens, gen=gen, rng=jax.random.key(0)).max() < 30


def test_a_causal_lm_never_writes_a_special_token_but_end_of_text():
  """Its targets are text and EOS, so [MASK] or <extra_id_5> from an
  undertrained model is noise; a T5 keeps its sentinels."""
  tok = types.SimpleNamespace(special_ids=np.array([0, 1, 2, 5, 9], np.int32), eos_id=1)
  assert G.never_written(tok, "decoder") == (0, 2, 5, 9)
  assert G.never_written(tok, "encoder_decoder") == ()
  params = _params(DECODER)
  tokens = np.random.RandomState(4).randint(2, 61, (4, 5))
  free = G.generate(DECODER, params, tokens, gen=G.GenerationConfig(max_new_tokens=12))
  banned = tuple(sorted(set(free.ravel().tolist())))[:3]  # ids it does pick
  for gen in (G.GenerationConfig(max_new_tokens=12, suppress_ids=banned),
              G.GenerationConfig(max_new_tokens=12, suppress_ids=banned, vocab_size=30,
                                 temperature=2.0)):
    out = G.generate(DECODER, params, tokens, gen=gen, rng=jax.random.key(0))
    assert not np.isin(out, banned).any()


def test_repetition_penalty_avoids_repeats():
  params = _params(DECODER)
  tokens = np.array([[3, 4, 5]])
  out = G.generate(DECODER, params, tokens, gen=G.GenerationConfig(
      max_new_tokens=12, repetition_penalty=1e9))
  seq = [3, 4, 5] + out[0].tolist()
  assert len(set(seq)) == len(seq)


@pytest.mark.slow
def test_beam_search():
  params = _params(T5)
  tokens = np.random.RandomState(2).randint(2, 61, (2, 6))
  greedy = G.generate(T5, params, tokens, gen=G.GenerationConfig(max_new_tokens=7))
  one = G.generate(T5, params, tokens, gen=G.GenerationConfig(max_new_tokens=7, num_beams=1))
  np.testing.assert_array_equal(one, greedy)
  gen = G.GenerationConfig(max_new_tokens=7, num_beams=4, num_return_sequences=2,
                           length_penalty=0.0)
  beams = G.generate(T5, params, tokens, gen=gen)
  assert beams.shape == (4, 7)
  assert beams.max() >= 30  # and within the tokenizer's ids, none past them:
  assert G.generate(T5, params, tokens, gen=dataclasses.replace(gen, vocab_size=30)).max() < 30

  def logprob(rows, enc):
    dec_in = np.concatenate([np.zeros((len(rows), 1), int), rows[:, :-1]], 1)
    logits = build_model(T5).apply({"params": params}, jnp.asarray(enc), jnp.asarray(dec_in))[
        "logits"]
    lp = jax.nn.log_softmax(logits)
    return np.asarray(jnp.take_along_axis(lp, jnp.asarray(rows)[..., None], -1)[..., 0].sum(-1))
  best = beams[::2]
  assert (logprob(best, tokens) >= logprob(greedy, tokens) - 1e-4).all()
  assert (logprob(beams[::2], tokens) >= logprob(beams[1::2], tokens) - 1e-4).all()


def test_bad_requests_are_refused():
  enc = DECODER.replace(family="encoder")
  with pytest.raises(ValueError, match="does not generate"):
    G.generate(enc, {}, np.ones((1, 2)), gen=G.GenerationConfig())
  with pytest.raises(ValueError, match="exceeds the model's max_len 64"):
    G.generate(DECODER, {}, np.ones((1, 60)), gen=G.GenerationConfig(max_new_tokens=10))
  with pytest.raises(ValueError, match="beam search is for encoder-decoder"):
    G.generate(DECODER, {}, np.ones((1, 2)), gen=G.GenerationConfig(num_beams=2))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["gpt2", "t5", "bart"])
def test_greedy_matches_transformers_generate(model_type, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from jaxtl import convert  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  if model_type == "gpt2":
    config = transformers.GPT2Config(vocab_size=97, n_embd=40, n_layer=2, n_head=5,
                                     n_positions=32, eos_token_id=3, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
  elif model_type == "t5":
    config = transformers.T5Config(vocab_size=97, d_model=40, d_kv=8, d_ff=48, num_layers=2,
                                   num_heads=5, decoder_start_token_id=0, eos_token_id=3,
                                   pad_token_id=0, feed_forward_proj="gated-gelu")
    model = transformers.T5ForConditionalGeneration(config)
  else:  # BART, HF's ids: <s> 0, pad 1, </s> 2, which also starts decoding
    config = transformers.BartConfig(
        vocab_size=97, d_model=40, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=5, decoder_attention_heads=5, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=32, forced_eos_token_id=None)
    assert config.decoder_start_token_id == config.eos_token_id == 2
    model = transformers.BartForConditionalGeneration(config)
  with torch.no_grad():  # sharper logits than the init's: fewer near-ties
    for p in model.parameters():
      if model_type == "bart":  # (scaled, its init writes one token whatever the input)
        p.add_(0.5 * torch.randn_like(p))
      else:
        p.mul_(4.0 if p.ndim == 2 else 1.0)
  model.eval().save_pretrained(tmp_path)
  imported = convert.import_hf(tmp_path)
  assert imported.config.decoder_start == ("eos" if model_type == "bart" else "pad")
  pad, eos = config.pad_token_id, config.eos_token_id
  prompts = np.random.RandomState(0).randint(4, 97, (3, 6))
  with torch.no_grad():
    theirs = model.generate(torch.tensor(prompts), do_sample=False, max_new_tokens=10,
                            min_new_tokens=0).numpy()
  theirs = theirs[:, prompts.shape[1]:] if model_type == "gpt2" else theirs[:, 1:]
  ours = G.generate(imported.config, imported.params, prompts,
                    gen=G.GenerationConfig(max_new_tokens=10, eos_id=eos, pad_id=pad))
  np.testing.assert_array_equal(ours[:, :theirs.shape[1]], theirs)
  assert (ours[:, theirs.shape[1]:] == pad).all()  # HF stops once all rows ended
  if model_type == "bart":  # the start token matters: from pad it writes another text
    from_pad = G.generate(imported.config.replace(decoder_start="pad"), imported.params,
                          prompts, gen=G.GenerationConfig(max_new_tokens=10, eos_id=eos,
                                                          pad_id=pad))
    assert (from_pad != ours).any()


@pytest.mark.slow
@pytest.mark.subprocess
def test_command_line_generates_text(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import datadir  # pylint: disable=g-import-not-at-top
  from jaxtl import convert  # pylint: disable=g-import-not-at-top
  vocab = datadir.require_data("tokenizers", "gpt2_vocab.json")
  cfg = DECODER.replace(vocab_size=50257, tie_embeddings=True, activation="gelu_new",
                        norm_eps=1e-5)
  params = build_model(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  convert.export_hf(tmp_path / "gpt2", cfg, params)
  out = subprocess.run(
      [sys.executable, "-m", "jaxtl", "generate", f"--checkpoint={tmp_path / 'gpt2'}",
       f"--tokenizer={vocab}", "--prompt=Hello there", "--prompt=Why", "--prompt=",
       "--max_new_tokens=4", "--temperature=1.0", "--num_return_sequences=2",
       "--compute_dtype=bfloat16"],
      capture_output=True, text=True, timeout=300, check=True)
  lines = [l for l in out.stdout.splitlines() if l.startswith("[")]
  assert len(lines) == 6 and lines[0].startswith("[0] Hello there") and lines[3].startswith(
      "[3] Why") and lines[4].startswith("[4] ")  # an empty prompt: a text from scratch
  from jaxtl.pretraining import pretrained  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path / "gpt2")
  assert pretrained.load(folder, str(vocab)).config.dtype == "float32"  # as imported
  assert pretrained.load(folder, str(vocab), "bfloat16").config.dtype == "bfloat16"
  with pytest.raises(ValueError, match="compute_dtype='f16'; expected auto"):
    pretrained.load(folder, str(vocab), "f16")


def test_prompts_are_left_padded_and_an_empty_one_starts_a_new_document():
  class Tok:  # one id per word
    pad_id, eos_id = 0, 1

    def encode(self, text):
      return [len(w) + 1 for w in text.split()]

  tokens, mask = G.prompt_arrays(Tok(), ["ab c", ""], "decoder")
  np.testing.assert_array_equal(tokens, [[3, 2], [0, 1]])  # "": end-of-text, as after
  np.testing.assert_array_equal(mask, [[1, 1], [0, 1]])  # every pretraining document
  tokens, _ = G.prompt_arrays(Tok(), ["ab", ""], "encoder_decoder")
  np.testing.assert_array_equal(tokens, [[3, 1], [0, 1]])  # T5's input ends in EOS


def test_the_prompt_pass_computes_logits_for_its_last_position_only():
  """A long prompt's B x P x V logits would be most of the prompt pass's
  work; only the last position's choose the first token."""
  params = _params(DECODER)
  tokens = jax.ShapeDtypeStruct((3, 13), jnp.int32)
  hlo = G._generate_decoder.lower(DECODER, G.GenerationConfig(max_new_tokens=4), params,
                                  tokens, tokens, jax.random.key(0)).compile().as_text()
  v = DECODER.vocab_size
  assert f"[3,{v}]" in hlo
  assert f"[3,13,{v}]" not in hlo and f"[39,{v}]" not in hlo
