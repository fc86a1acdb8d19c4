#!/usr/bin/env bash
# Issue 34's measurements on the CPU this runs on (run on an Intel Xeon with
# AMX on 2026-11-28: docs/studies/performance.md); each stage prints a table:
#
#   launch/cpu_check.sh dots     # which dot forms reach the fast kernels (launch/cpu_dots.py),
#                                # with XLA's defaults and with oneDNN's matmuls
#   launch/cpu_check.sh flags    # MiniLM's step per XLA:CPU flag: float32, bfloat16, and
#                                # bfloat16 with row-major dots (model.row_major_dots)
#   launch/cpu_check.sh versus   # each flag of the flag stage against XLA's defaults in ONE
#                                # process (jaxtl benchmark --versus): the noise-proof table;
#                                # confirm the winner with the flag stage (XLA_FLAGS)
#   launch/cpu_check.sh rules    # each per-CPU rule of jaxtl.runtime.xla_cpu flipped for this
#                                # CPU against the step as configured, one step a round in ONE
#                                # process (--versus=cpu_rule=TABLE): whether a rule should
#                                # name this CPU, or stop naming it
#   launch/cpu_check.sh step     # the same three beside PyTorch, alternated ($ROUNDS rounds)
#   launch/cpu_check.sh accuracy # TREC and SST-2 (9,000 rows), 3 seeds, float32 against bfloat16
#   launch/cpu_check.sh floor    # the step beside the sum of its matmuls, attention and update
#                                # timed alone (launch/step_floor.py), PyTorch's step in turns:
#                                # the most jaxtl could be ahead with this CPU's kernels
#
# Logs and the benchmark's result blocks go to $OUT (or ./cpu_out).
# $SHAPE (e.g. "--batch_size=10 --length=48", TREC's packed batch) sets the
# shape of the flags, versus and step stages (default: the preset's 32 x 64).
# $FLAG_SETTINGS (';'-separated, each a list of VAR=value) replaces the
# flag stage's settings; "JAXTL_CPU_FLAGS=0" alone is XLA's defaults.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-cpu_out}
mkdir -p "$out"
lscpu | grep -E "Model name|^L3" | tee -a "$out/cpu.txt"
modes=("--dtype=float32" "--dtype=bfloat16" "--dtype=bfloat16 --model=row_major_dots=true")

bench() {  # ENV... -- BENCHMARK FLAGS...: one row of the table
  local envs=() setting
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  setting="${envs[*]:-XLA defaults} $*"
  env "${envs[@]}" python -m jaxtl benchmark --presets="${PRESET:-minilm_cls}" \
      --steps="${STEPS:-6}" --warmup=2 --results="$out/benchmark_results.md" ${SHAPE:-} "$@" 2>&1 \
    | tee -a "$out/bench.log" | grep '^{"preset"' | python3 -c '
import json, sys
for line in sys.stdin:
  r = json.loads(line)
  cells = [sys.argv[1], r["step ms"], r.get("PyTorch step ms", ""),
           r.get("jaxtl / PyTorch", ""), r["compile s"]]
  print("| " + " | ".join(cells) + " |")' "$setting"
}

header() { echo "| setting | step ms | PyTorch ms | jaxtl / PyTorch | compile s |"; echo "|---|---:|---:|---:|---:|"; }

case ${1:-} in
  dots)
    python launch/cpu_dots.py 2>&1 | grep -v "^[IW][0-9]" | tee "$out/dots_default.md"
    XLA_FLAGS="--xla_cpu_use_onednn=true --xla_cpu_experimental_ynn_fusion_type=" \
      python launch/cpu_dots.py 2>&1 | grep -v "^[IW][0-9]" | tee "$out/dots_onednn.md"
    ;;
  flags)
    # The first two settings are XLA's defaults twice: the spread between runs.
    IFS=';' read -ra settings <<<"${FLAG_SETTINGS:-JAXTL_CPU_FLAGS=0;JAXTL_CPU_FLAGS=0;\
JAXTL_CPU_FLAGS=0 XLA_FLAGS=--xla_cpu_use_onednn=true;\
JAXTL_CPU_FLAGS=0 XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=;\
JAXTL_CPU_FLAGS=0 XLA_FLAGS=--xla_cpu_experimental_onednn_fusion_type=dot;\
JAXTL_CPU_FLAGS=0 XLA_FLAGS=--xla_cpu_experimental_xnn_fusion_type=dot;\
JAXTL_CPU_FLAGS=0 XLA_FLAGS=--xla_cpu_prefer_vector_width=512;\
JAXTL_CPU_FLAGS=0 XLA_FLAGS=--xla_cpu_enable_fast_math=true}"
    header | tee "$out/flags.md"
    for mode in "${modes[@]}"; do
      for s in "${settings[@]}"; do
        read -ra envs <<<"$s"
        bench "${envs[@]}" -- $mode | tee -a "$out/flags.md"
      done
    done
    ;;
  versus)
    # XLA options by their DebugOptions names (enums by full name; empty:
    # none), given to the second program's compile alone.
    IFS=';' read -ra settings <<<"${VERSUS_SETTINGS:-xla_cpu_use_onednn=true,\
xla_cpu_experimental_ynn_fusion_type=;xla_cpu_use_onednn=true;\
xla_cpu_experimental_ynn_fusion_type=;\
xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT;\
xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT;\
xla_cpu_prefer_vector_width=512;xla_cpu_enable_fast_math=true}"
    for mode in "${modes[@]}"; do
      for s in "${settings[@]}"; do
        JAXTL_CPU_FLAGS=0 python -m jaxtl benchmark --presets="${PRESET:-minilm_cls}" \
            --steps="${STEPS:-5}" --rounds="${ROUNDS:-6}" --warmup=2 --versus="$s" \
            --results="$out/benchmark_results.md" ${SHAPE:-} $mode 2>&1 \
          | tee -a "$out/versus.log" | grep "^| ${PRESET:-minilm_cls}" | tee -a "$out/versus.md"
      done
    done
    ;;
  rules)
    # The float32 tables at float32, bf16's at auto (the table decides it).
    for setting in "--dtype=float32 FLOAT32_ROW_MAJOR_RULES" \
                   "--dtype=float32 FLOAT32_FOLDED_DX_RULES" "--dtype=auto BF16_RULES"; do
      read -r dtype table <<<"$setting"
      for shape in "--batch_size=10 --length=48" ""; do
        python -m jaxtl benchmark --presets="${PRESET:-minilm_cls}" $dtype $shape \
            --versus=cpu_rule=$table --steps=1 --warmup=3 --rounds="${ROUNDS:-40}" \
            --results="$out/benchmark_results.md" 2>&1 \
          | tee -a "$out/rules.log" | grep -E "^\| ${PRESET:-minilm_cls}|^jaxtl benchmark:" \
          | tee -a "$out/rules.md"
      done
    done
    ;;
  step)
    header | tee "$out/step.md"
    for _ in $(seq ${ROUNDS:-2}); do
      for mode in "${modes[@]}"; do
        # Plain bf16 is XLA's own path: on a CPU of BF16_RULES jaxtl's rules
        # would give it row-major dots, the next mode.
        envs=(); [[ $mode == "--dtype=bfloat16" ]] && envs=(JAXTL_CPU_FLAGS=0)
        bench "${envs[@]}" -- --torch $mode | tee -a "$out/step.md"
      done
    done
    ;;
  accuracy)
    # bfloat16 is the default on a CPU class only within 0.5 points of float32.
    for run in "float32" "bfloat16" "bfloat16 --row_major_dots"; do
      read -r dtype extra <<<"$run"
      python launch/minilm_trec.py --notorch --seeds=0,1,2 --epochs=3 \
        --workdir="/tmp/cpu_check/trec_${run// /}" --compute_dtype=$dtype $extra 2>&1 \
        | tee -a "$out/accuracy.log" | grep -vE "^(I|W)[0-9]{4}" | tail -6
    done
    for run in "float32" "bfloat16 --row_major_dots"; do
      read -r dtype extra <<<"$run"
      python launch/minilm_trec.py --notorch --task=sst2 --train_examples=9000 --epochs=1 \
        --seeds=0,1,2 --workdir="/tmp/cpu_check/sst2_${run// /}" --compute_dtype=$dtype $extra \
        2>&1 | tee -a "$out/accuracy.log" | grep -vE "^(I|W)[0-9]{4}" | tail -6
    done
    ;;
  floor)
    for shape in "--batch_size=32 --length=64" "--batch_size=10 --length=48"; do
      for dtype in auto float32; do
        python launch/step_floor.py --torch $shape --dtype=$dtype 2>&1 \
          | tee -a "$out/floor.log" | grep -vE "^(I|W)[0-9]{4}|computing in" | tee -a "$out/floor.md"
      done
    done
    ;;
  *) echo "usage: launch/cpu_check.sh dots|flags|versus|rules|step|accuracy|floor"; exit 2;;
esac
