#!/usr/bin/env bash
# Every GPU check and benchmark of the project in one run, for one GPU machine (an H100 or H200
# whose image has Python 3.12, PyTorch 2.11, Triton 3.6 and CUDA, and no network): at most ~10
# minutes, usually much less.
#
#   bash bench/device_wheels.sh        # first, on a machine with the package index: bench/wheels/
#   bash bench/device_check.sh         # on the GPU machine (the device tool carries bench/wheels)
#   bash bench/device_dryrun.sh        # before a lease: this script on CPU under torch 2.11
#
# bench/wheels/ holds only what the image lacks (pure-Python wheels): they go into their own
# folder ($COMERA_DEVICE_SITE, first on PYTHONPATH) with --no-deps, so the image's torch and
# the rest stay as they are.
#
# Steps (each bounded by a timeout, each logged to $OUT/<step>.log):
#   kernel_tests  the Triton kernels compiled on CUDA tensors against their float64 references
#   gpu_tests     the tests marked gpu: CUDA-graph replay equals eager, gate updates persist
#   ttm_lookup    TTM lookup, Triton vs torch (bench.ttm_embedding --triton-only)
#   train_step    CoMERA vs dense vs GaLore (vs TensorLy-Torch) step time and peak memory
#   cuda_graph    the batch-1 (and 8) training step with CUDA graphs on vs off
#   ddp_step      one job as 1 process vs devices: 2 under torchrun (NCCL) on the one GPU: a
#                 smoke test of the data-parallel path on CUDA, with both step times
# then one summary table (bench.device_summary). JSON results go to $OUT too. train_step and
# cuda_graph exit 2 when CUDA is unavailable (nothing measured, no JSON): a failed step here.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device}
mkdir -p "$OUT"
export COMERA_BENCH_RESULTS="$OUT" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

SITE=${COMERA_DEVICE_SITE:-/tmp/comera-device-site}
if compgen -G "bench/wheels/*.whl" > /dev/null; then  # only what the image lacks
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" bench/wheels/*.whl > "$OUT/pip.log" 2>&1 \
    || echo "the wheels did not install: see $OUT/pip.log"
  export PYTHONPATH="$SITE:$PYTHONPATH"
fi
$PY - <<'PY' | tee "$OUT/env.txt"
import torch, triton
print(f"torch {torch.__version__}  triton {triton.__version__}  cuda {torch.version.cuda}  "
      f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}")
PY

fail=0
: > "$OUT/steps.tsv"
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || fail=1
  [ "$rc" -eq 2 ] && grep -q "needs a CUDA device" "$OUT/$name.log" && echo "$name: no CUDA device"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
  tail -n 4 "$OUT/$name.log"
}
PYTEST=($PY -m pytest -q -p no:cacheprovider -o addopts= -o timeout=0
  --continue-on-collection-errors)
# only the modules that hold gpu tests: a module whose import needs what the image lacks (a
# model package, say) must not stop the collection of the others
mapfile -t GPU_MODULES < <(grep -rlE --include='test_*.py' 'mark\.gpu' tests/engine | sort)
step kernel_tests 120 "${PYTEST[@]}" tests/engine/kernels
step gpu_tests 90 "${PYTEST[@]}" -m gpu "${GPU_MODULES[@]}"
step ttm_lookup 60 $PY -m bench.ttm_embedding --triton-only
step train_step 180 $PY -m bench.train_step --device cuda --quick
step cuda_graph 60 $PY -m bench.cuda_graph
step ddp_step 90 $PY -m bench.ddp_step --device cuda --devices 2 --steps 60
$PY -m bench.device_summary "$OUT" | tee "$OUT/summary.txt"
exit "$fail"
