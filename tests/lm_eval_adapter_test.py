"""The lm-eval adapter: the harness runs local tasks of all three request
kinds end to end, offline, and its answers are jaxtl's own scores."""

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

from jaxtl.data.sentencepiece_training import train_sentencepiece  # noqa: E402
from jaxtl.eval import lm_eval_adapter, scoring  # noqa: E402
from jaxtl.models import TransformerConfig, build_model  # noqa: E402
from jaxtl.pretraining.pretrained import Pretrained  # noqa: E402

REVIEWS = [("a fine and moving film", 1), ("dull and far too long", 0),
           ("the best film this year", 1), ("a waste of time", 0)]
QA = [("what is two and two", "four"), ("what colour is the sky", "blue")]
TASKS = {
    "jaxtl_local_sentiment": """
        output_type: multiple_choice
        doc_to_text: "Review: {{text}}\\nSentiment:"
        doc_to_choice: ["negative", "positive"]
        doc_to_target: label
        metric_list:
          - metric: acc
        """,
    "jaxtl_local_qa": """
        output_type: generate_until
        doc_to_text: "Q: {{question}}\\nA:"
        doc_to_target: "{{answer}}"
        generation_kwargs:
          until: ["\\n", "."]
          max_gen_toks: 6
        metric_list:
          - metric: exact_match
        """,
    "jaxtl_local_text": """
        output_type: loglikelihood_rolling
        doc_to_text: ""
        doc_to_target: "{{text}}"
        metric_list:
          - metric: word_perplexity
          - metric: bits_per_byte
        """,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tok")
  lines = [t for t, _ in REVIEWS] + [f"{q} {a}" for q, a in QA] * 3 + [
      "Review: Sentiment: negative positive Q: A: the of and a to in is"] * 5
  tok = train_sentencepiece(lines * 4, tmp / "sp", 60, num_sentinels=0)
  cfg = TransformerConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32,
                          num_heads=4, head_dim=8, mlp_dim=64, num_layers=2, max_len=24,
                          dropout_rate=0.0)
  params = build_model(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  return Pretrained(cfg, tok, params, {})


def _write_tasks(tmp_path):
  """Task YAMLs reading JSON lines the test writes: the harness's json
  builder on local files, so nothing is downloaded."""
  data = {"jaxtl_local_sentiment": [{"text": t, "label": y} for t, y in REVIEWS],
          "jaxtl_local_qa": [{"question": q, "answer": a} for q, a in QA],
          # Longer than max_length (24): scored in several windows.
          "jaxtl_local_text": [{"text": " ".join(t for t, _ in REVIEWS * 3)},
                               {"text": "a dull film"}]}
  for name, body in TASKS.items():
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data[name]))
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(f"""
        task: {name}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {path}
          cache_dir: {tmp_path / 'hf_cache'}
        test_split: test
        """) + textwrap.dedent(body))


@pytest.mark.slow
def test_harness_runs_local_tasks_end_to_end(model, tmp_path, monkeypatch):
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  _write_tasks(tmp_path)
  lm = lm_eval_adapter.JaxtlLM(loaded=model, batch_size=4)
  results = lm_eval.simple_evaluate(
      model=lm, tasks=list(TASKS), task_manager=lm_eval.tasks.TaskManager(
          include_path=str(tmp_path)), num_fewshot=0, random_seed=0, log_samples=True)
  res = results["results"]
  assert 0.0 <= res["jaxtl_local_sentiment"]["acc,none"] <= 1.0
  assert 0.0 <= res["jaxtl_local_qa"]["exact_match,none"] <= 1.0
  assert np.isfinite(res["jaxtl_local_text"]["word_perplexity,none"])
  # The harness's multiple-choice scores are jaxtl's continuation scores.
  sample = results["samples"]["jaxtl_local_sentiment"][0]
  ctx, cont = lm._encode_pair(sample["arguments"][1][0], sample["arguments"][1][1])  # pylint: disable=protected-access
  want = scoring.loglikelihoods(model.config, model.params, [(ctx, cont)])[0][0]
  np.testing.assert_allclose(float(sample["resps"][1][0][0]), want, rtol=1e-5)


@pytest.mark.slow
def test_rolling_windows_score_every_token_once(model):
  from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # pylint: disable=g-import-not-at-top
  lm = lm_eval_adapter.JaxtlLM(loaded=model, batch_size=4)
  long, short = " ".join(t for t, _ in REVIEWS * 3), "a dull film"
  reqs = [type("Req", (), {"args": (t,)})() for t in (long, short)]
  got = lm.loglikelihood_rolling(reqs)
  one = lambda pairs: scoring.loglikelihoods(model.config, model.params, pairs,
                                             batch_size=1)[0].sum()
  # A text that fits: one request, after the prefix token.
  ids = lm.tok_encode(short, False)
  np.testing.assert_allclose(got[1], one([([lm.prefix_token_id], ids)]), rtol=1e-5)
  # A longer one: the harness's windows, each token predicted once.
  ids = lm.tok_encode(long, False)
  windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
      ids, lm.prefix_token_id, 24, 1)]
  assert len(windows) > 1 and sum(len(c) for _, c in windows) == len(ids)
  np.testing.assert_allclose(got[0], one(windows), rtol=1e-5)


def test_generation_stops_at_the_stop_strings(model):
  lm = lm_eval_adapter.JaxtlLM(loaded=model, batch_size=4)
  reqs = [type("Req", (), {"args": (f"Q: {q}\nA:", {"until": ["e"], "max_gen_toks": 5})})()
          for q, _ in QA]
  out = lm.generate_until(reqs)
  assert len(out) == 2 and all("e" not in o for o in out)


@pytest.mark.slow
def test_an_encoder_decoder_answers_all_three_requests(model):
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=model.config.vocab_size,
                          d_model=32, num_heads=4, head_dim=8, mlp_dim=64, num_layers=2,
                          max_len=24, position="relative", norm="rmsnorm", use_bias=False,
                          scale_attention=False, dropout_rate=0.0, relative_buckets=8,
                          relative_max_distance=16)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = build_model(cfg).init(jax.random.key(0), tokens, tokens)["params"]
  lm = lm_eval_adapter.JaxtlLM(loaded=Pretrained(cfg, model.tokenizer, params, {}),
                               batch_size=2)
  req = lambda *args: type("Req", (), {"args": args})()
  (logp, _), = lm.loglikelihood([req("Review: a dull film\nSentiment:", " negative")])
  ctx = lm.tok_encode("Review: a dull film\nSentiment:")
  assert ctx[-1] == model.tokenizer.eos_id  # T5 reads an EOS-terminated input
  cont = lm.tok_encode(" negative", add_special_tokens=False)
  np.testing.assert_allclose(logp, scoring.loglikelihoods(cfg, params, [(ctx, cont)])[0][0],
                             rtol=1e-5)
  assert np.isfinite(lm.loglikelihood_rolling([req("a fine film " * 10)])[0])
  out = lm.generate_until([req("Q: what is two and two\nA:", {"max_gen_toks": 4})])
  assert isinstance(out[0], str)


def test_the_harness_dtype_argument_sets_the_precision(model, monkeypatch):
  asked = []
  monkeypatch.setattr(lm_eval_adapter.pretrained, "load",
                      lambda checkpoint, tokenizer, dtype: asked.append(dtype) or model)
  lm_eval_adapter.JaxtlLM(checkpoint="runs/clm", dtype="bfloat16")  # --model_args ...,dtype=
  lm_eval_adapter.JaxtlLM(checkpoint="runs/clm")
  assert asked == ["bfloat16", ""]


def test_the_command_runs_lm_evals_run_with_the_jaxtl_model_and_passes_the_others(
    monkeypatch):
  import sys  # pylint: disable=g-import-not-at-top
  from jaxtl.programs import lm_eval as command  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(command, "cli_evaluate", lambda: seen.append(sys.argv[1:]))
  monkeypatch.setattr(sys, "argv", list(sys.argv))
  for argv in ([], ["--tasks=x"], ["run", "--tasks=x"], ["ls", "tasks"]):
    command.main(["jaxtl lm_eval", *argv])
  model = f"--model={lm_eval_adapter.NAME}"
  assert seen == [["run", model], ["run", model, "--tasks=x"], ["run", model, "--tasks=x"],
                  ["ls", "tasks"]]


def test_the_commands_help_says_what_jaxtl_fills_in(monkeypatch, capsys):
  from jaxtl.programs import lm_eval as command  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(command, "cli_evaluate", lambda: None)
  command.main(["jaxtl lm_eval", "--help"])
  assert capsys.readouterr().out.startswith("jaxtl lm_eval: lm-eval's `run` with --model=jaxtl")
  command.main(["jaxtl lm_eval", "ls", "tasks"])
  assert not capsys.readouterr().out
