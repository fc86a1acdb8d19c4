#!/usr/bin/env bash
# Runs jaxtl on every worker (host) of a Cloud TPU VM slice or pod, from your
# own machine, over `gcloud compute tpus tpu-vm ssh --worker=all`.
#
# A TPU pod is multi-controller: each worker runs the same command, owns its
# local TPU chips, and jax.distributed.initialize() (--multiprocess) finds
# the other workers through the TPU metadata, so no addresses are needed.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_pod.sh [--setup] TPU_NAME ZONE RECIPE WORKDIR [OVERRIDE...]
       launch/tpu_pod.sh --setup-only TPU_NAME ZONE

Runs `python3 -m jaxtl COMMAND --multiprocess --config=... --workdir=...` on
all workers of the TPU VM TPU_NAME in ZONE; COMMAND is $JAXTL_COMMAND
(default: pretrain).

  --setup       first put the code on every worker and install it, then train:
                  * JAXTL_GIT_URL set: git clone (or pull) it into REMOTE_DIR;
                  * otherwise: copy this checkout (tracked and untracked,
                    non-ignored files, uncommitted edits included) there;
                  then, in REMOTE_DIR: pip install -U 'jax[tpu]' -e '.[tfds]'.
                Needed once per new TPU VM and after code changes (when
                copying).
  --setup-only  the same, without training afterwards.
  RECIPE        pretrain_mlm | pretrain_clm | pretrain_span (or configs/NAME.py,
                NAME:arg; finetune and transfer_study go with
                JAXTL_COMMAND=finetune/study)
  WORKDIR       must be visible to every worker with the same name: a gs://
                bucket path (best; the TPU VM's service account needs write
                access) or a shared mount. A local disk path would give each
                worker its own partial checkpoint.
  OVERRIDE      passed through, quoted safely for the remote shell, e.g.
                --config.mesh.shape='(1,-1,1)'

Environment:
  JAXTL_COMMAND   pretrain | finetune | study: the jaxtl command to run
                  (default: pretrain)
  REMOTE_DIR      code location on the workers, absolute or relative to the
                  home directory (default: jaxtl, i.e. ~/jaxtl)
  JAXTL_GIT_URL   repo to clone on --setup (default: copy this checkout)
  JAXTL_GIT_REF   branch, tag or commit to check out (default: the remote's
                  default branch)
  JAXTL_DATA_DIR  forwarded as is: a path that exists on every worker (a
                  gs:// bucket for TFDS data, or a disk/mount on each worker)
  REMOTE_PYTHON   interpreter on the workers (default: python3)
  GCLOUD_FLAGS    extra gcloud flags, e.g. "--project=my-proj --internal-ip"

Notes: training stops if this ssh session ends, so run the script inside
tmux/screen. If a killed run leaves a worker's TPU busy ("TPU in use"), end
the leftover python process on that worker (find it with
pgrep -af 'jaxtl (pretrain|finetune|study)').
Example:
  launch/tpu_pod.sh --setup my-v4-32 us-central2-b pretrain_mlm \
      gs://my-bucket/runs/mlm --config.mesh.shape='(1,-1,1)'
EOF
}

die() { echo "tpu_pod.sh: $*" >&2; exit 2; }

setup=0 train=1
case ${1-} in
  -h|--help) usage; exit 0 ;;
  --setup) setup=1; shift ;;
  --setup-only) setup=1 train=0; shift ;;
esac
if (( train && $# < 4 )) || (( !train && $# < 2 )); then usage >&2; exit 2; fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TPU_NAME=$1 ZONE=$2
shift 2
REMOTE_DIR=${REMOTE_DIR:-jaxtl}
REMOTE_PYTHON=${REMOTE_PYTHON:-python3}
# Word-split on purpose: GCLOUD_FLAGS holds several flags.
read -r -a gcloud_flags <<<"${GCLOUD_FLAGS-}"

# Runs one shell command line on all workers at once. (The ${a[@]+...} form
# keeps an empty array legal under set -u in macOS's bash 3.2.)
on_all_workers() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
    ${gcloud_flags[@]+"${gcloud_flags[@]}"} --command="$1"
}

# printf %q quotes each word so the worker's shell gets it back unchanged:
# without it, '(1,-1,1)' in an override is a syntax error over there.
q() { printf '%q' "$1"; }

if (( setup )); then
  if [[ -n ${JAXTL_GIT_URL-} ]]; then
    # Fetch-then-checkout FETCH_HEAD treats branches, tags and commits alike
    # and works on a fresh clone and on a rerun (detached HEAD is fine here).
    d=$(q "$REMOTE_DIR")
    fetch="{ [ -d $d/.git ] || git clone -q $(q "$JAXTL_GIT_URL") $d; }"
    fetch+=" && git -C $d fetch -q origin $(q "${JAXTL_GIT_REF:-HEAD}")"
    fetch+=" && git -C $d checkout -q --detach FETCH_HEAD"
  else
    # git decides what belongs to the code: caches, venvs and build outputs
    # are ignored, so the copy stays small. Files deleted but not yet
    # committed are still listed by git, hence the existence test.
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
      | while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done \
      | COPYFILE_DISABLE=1 tar --null -T - -czf "$tmp/jaxtl_src.tgz")
    echo "tpu_pod.sh: copying $(du -h "$tmp/jaxtl_src.tgz" | cut -f1) of code to all workers" >&2
    gcloud compute tpus tpu-vm scp "$tmp/jaxtl_src.tgz" "$TPU_NAME:jaxtl_src.tgz" \
      --zone="$ZONE" --worker=all ${gcloud_flags[@]+"${gcloud_flags[@]}"}
    fetch="mkdir -p $(q "$REMOTE_DIR") && tar -xzf jaxtl_src.tgz -C $(q "$REMOTE_DIR") && rm jaxtl_src.tgz"
  fi
  # jax[tpu] brings the matching libtpu; one pip call lets the resolver pick
  # versions that satisfy both it and jaxtl's own requirements.
  install="cd $(q "$REMOTE_DIR") && $(q "$REMOTE_PYTHON") -m pip install -q -U 'jax[tpu]' -e '.[tfds]'"
  on_all_workers "set -e; $fetch && $install"
fi

(( train )) || exit 0
recipe=$1 workdir=$2
shift 2
command=${JAXTL_COMMAND:-pretrain}
case $command in
  pretrain|finetune|study) ;;
  *) die "JAXTL_COMMAND must be pretrain, finetune or study, got '$command'" ;;
esac

# RECIPE -> --config value (relative to REMOTE_DIR on the workers); an
# optional ":arg" suffix is the config file's argument.
config_file=${recipe%%:*}
config_arg=""
[[ $recipe == *:* ]] && config_arg=":${recipe#*:}"
[[ $config_file == */* ]] || config_file="configs/${config_file%.py}.py"
# Catch typos here rather than on every worker (only for files in this repo).
[[ $config_file == /* || -f $REPO/$config_file ]] || die "no config file '$config_file' in $REPO"
[[ $workdir == gs://* || $workdir == /* ]] \
  || echo "tpu_pod.sh: warning: WORKDIR '$workdir' is neither gs:// nor absolute; every worker must see the same place" >&2

cmd=(env)
[[ -n ${JAXTL_DATA_DIR-} ]] && cmd+=("JAXTL_DATA_DIR=$JAXTL_DATA_DIR")
cmd+=("$REMOTE_PYTHON" -m jaxtl "$command" --multiprocess
      "--config=$config_file$config_arg" "--workdir=$workdir" ${1+"$@"})

remote="cd $(q "$REMOTE_DIR") &&"
for word in "${cmd[@]}"; do remote+=" $(q "$word")"; done

echo "tpu_pod.sh: on all workers of $TPU_NAME: $remote" >&2
on_all_workers "$remote"
