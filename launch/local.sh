#!/usr/bin/env bash
# Runs one jaxtl training process on this machine (CPU, one GPU, or all the
# GPUs/TPU cores of one host: a single process drives every local device).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/local.sh RECIPE WORKDIR [OVERRIDE...]

Runs `python -m jaxtl COMMAND --config=configs/RECIPE.py --workdir=WORKDIR OVERRIDE...`
from the repository root, as one process on this machine; COMMAND is
$JAXTL_COMMAND (default: pretrain).

  RECIPE    pretrain_mlm | pretrain_clm | pretrain_span (or any configs/*.py;
            finetune and transfer_study go with JAXTL_COMMAND=finetune/study),
            also as configs/NAME.py, a path to a config file, or with a config
            argument: pretrain_mlm:model=bert_mini
  WORKDIR   checkpoints, metrics and caches; a relative path is taken from the
            directory you call this script from
  OVERRIDE  passed through, e.g. --config.optim.lr=3e-4
            --config.mesh.shape='(-1,1,1)'   (axes data, fsdp, tensor)

Environment:
  JAXTL_COMMAND     pretrain | finetune | study: the jaxtl command to run
                    (default: pretrain), e.g.
                    JAXTL_COMMAND=finetune launch/local.sh finetune:task=trec \
                      /tmp/trec --config.init_from=/tmp/m
  JAXTL_DATA_DIR    data root; defaults to <repo>/../shared/data when that exists
  PYTHON            interpreter to use (default: python)
  XLA_FAKE_DEVICES  N: pretend the CPU is N devices (adds
                    --xla_force_host_platform_device_count=N to XLA_FLAGS and
                    defaults JAX_PLATFORMS to cpu), to try meshes without
                    accelerators, e.g.
                    XLA_FAKE_DEVICES=8 launch/local.sh pretrain_mlm /tmp/m \
                      --config.mesh.shape='(2,2,2)'
EOF
}

die() { echo "local.sh: $*" >&2; exit 2; }

if [[ ${1-} == -h || ${1-} == --help ]]; then usage; exit 0; fi
if (( $# < 2 )); then usage >&2; exit 2; fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command=${JAXTL_COMMAND:-pretrain}
case $command in
  pretrain|finetune|study) ;;
  *) die "JAXTL_COMMAND must be pretrain, finetune or study, got '$command'" ;;
esac
recipe_spec=$1
workdir=$2
shift 2

# Turns RECIPE into the --config value. The config flag accepts
# "file.py:arg", so split off an optional ":arg" and resolve only the file.
config_file=${recipe_spec%%:*}
config_arg=""
[[ $recipe_spec == *:* ]] && config_arg=":${recipe_spec#*:}"
[[ $config_file == */* ]] || config_file="configs/${config_file%.py}.py"
if [[ -f $REPO/$config_file ]]; then
  :  # relative to the repo root, where we are about to cd
elif [[ -f $config_file ]]; then
  config_file="$(cd "$(dirname "$config_file")" && pwd)/$(basename "$config_file")"
else
  die "no config file '$config_file' (see $REPO/configs/)"
fi

# We cd to the repo root below (so `-m jaxtl` finds the package without
# an install), so a relative workdir must be pinned to the caller's cwd first.
# Remote URLs (gs://...) are left alone.
if [[ $workdir != /* && $workdir != *://* ]]; then
  workdir="$PWD/$workdir"
fi

# The configs read JAXTL_DATA_DIR when they are loaded; the checkout's sibling
# shared/data is the conventional place, so use it when nothing else is set.
if [[ -z ${JAXTL_DATA_DIR-} && -d $REPO/../shared/data ]]; then
  JAXTL_DATA_DIR="$(cd "$REPO/../shared/data" && pwd)"
  export JAXTL_DATA_DIR
fi

if [[ -n ${XLA_FAKE_DEVICES-} ]]; then
  [[ $XLA_FAKE_DEVICES =~ ^[1-9][0-9]*$ ]] \
    || die "XLA_FAKE_DEVICES must be a positive integer, got '$XLA_FAKE_DEVICES'"
  export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=$XLA_FAKE_DEVICES"
  # The flag only multiplies the CPU platform; without this a machine with a
  # GPU would still run on the GPU and the fake devices would go unused.
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
fi

cd "$REPO"
echo "local.sh: jaxtl $command config=$config_file$config_arg workdir=$workdir" \
     "data=${JAXTL_DATA_DIR:-<unset>}" >&2
# exec: Ctrl-C and kill reach Python directly, and its exit code is ours.
exec "${PYTHON:-python}" -m jaxtl "$command" \
  --config="$config_file$config_arg" --workdir="$workdir" "$@"
