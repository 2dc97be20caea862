#!/usr/bin/env bash
# bench/device_check.sh on this CPU machine, in a throwaway virtual environment shaped like the
# GPU machine's image, to catch import errors and torch APIs newer than the image's before a
# lease is spent on them. Not part of CI (minutes, and gigabytes of wheels).
#
#   bash bench/device_dryrun.sh [LOG]       # LOG: bench/results/device/dryrun.log
#
# The environment: torch 2.11.0 (the image's version), the image's other packages the check
# imports at the image's versions (transformers 5.17.0, tokenizers 0.23.2, safetensors 0.8.0,
# numpy, scipy, scikit-learn, pytest, pytest-timeout, hypothesis; numpy 2.4 here, the image's
# 2.5 needs Python 3.12), then bench/wheels/ exactly as device_check.sh installs it on the GPU
# machine (bench/device_wheels.sh makes it).
# What differs from the image: Python is this machine's python3 (3.11; the image has 3.12, and
# no CPython 3.12 installs from the package registries here: device_wheels.sh checks that its
# wheels are pure Python or cp312 instead), and there is no GPU, so the CUDA-only steps end
# with "needs a CUDA device" (exit 2) and GPU tests skip. So two more steps run on the CPU
# what those steps build: warm_up (a tiny training step of every bench.train_step
# configuration: CoMERA, dense, GaLore, TensorLy-Torch) and ddp_cpu (bench.ddp_step on the
# CPU, 1 process vs 2 under torchrun). The kernel tests run under Triton's interpreter here
# (on the GPU they are compiled): Triton 3.6's interpreter cannot run a loop whose bounds are
# computed in the kernel (``range(k_lo, tl.minimum(...), BLOCK_K)`` in the gemm kernel:
# "InterpreterError: TypeError('only 0-dimensional arrays can be converted to Python
# scalars')"; Triton 3.9's can), which this run lists but does not count. A pass means every
# step imported and started, and the CPU steps ran; it measures nothing. The step logs stay
# in $DRYRUN_KEEP (default /tmp/comera-dryrun-out).
#
# torch 2.11.0 on the package index is the CUDA build (530 MB for CPython 3.11). Installed
# with --no-deps it does not import on a machine without CUDA's libraries ("ImportError:
# libcudnn.so.9: cannot open shared object file"); with its CUDA library wheels (2.6 GB in all,
# 4.6 GB installed) it imports and runs on the CPU. The wheels are kept in $DRYRUN_WHEELS
# (default /tmp/comera-dryrun-wheels) for the next run; the environment is deleted at the end.
# DRYRUN_TORCH=VERSION picks another torch.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-bench/results/device/dryrun.log}
TORCH=${DRYRUN_TORCH:-2.11.0}
WHEELS=${DRYRUN_WHEELS:-/tmp/comera-dryrun-wheels}
IMAGE=(transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0 numpy scipy scikit-learn
  pytest pytest-timeout hypothesis)
TMP=$(mktemp -d /tmp/comera-dryrun.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$(dirname "$LOG")" "$WHEELS"
# pip's warnings about this machine's own index settings are dropped from the log
NOISE="is ignored: it is neither a file nor a directory"
exec > >(grep --line-buffered -v "$NOISE" | tee "$LOG") 2>&1
export PIP_CONSTRAINT= PIP_DISABLE_PIP_VERSION_CHECK=1  # the machine's cap on torch: not here
echo "== device dry run $(date -u +%FT%TZ), torch $TORCH, in $TMP"

python3 -m venv "$TMP/venv" || exit 1
PY=$TMP/venv/bin/python
$PY -m pip download -q --only-binary=:all: -d "$WHEELS" "torch==$TORCH" \
  || { echo "torch $TORCH could not be downloaded"; exit 1; }
$PY -m pip install -q --no-index --find-links "$WHEELS" "torch==$TORCH" \
  || { echo "torch $TORCH did not install"; exit 1; }
echo "torch==$TORCH" > "$TMP/keep-torch.txt"  # nothing below may replace it
$PY -m pip install -q -c "$TMP/keep-torch.txt" "${IMAGE[@]}" || { echo "image packages"; exit 1; }
bash bench/device_wheels.sh > "$TMP/wheels.log" 2>&1 || { cat "$TMP/wheels.log"; exit 1; }
$PY - <<'PY'
import platform, numpy, scipy, transformers, tokenizers, safetensors, pytest, torch, triton
print(f"python {platform.python_version()}  torch {torch.__version__}  triton "
      f"{triton.__version__}  transformers {transformers.__version__}  tokenizers "
      f"{tokenizers.__version__}  numpy {numpy.__version__}  cuda {torch.cuda.is_available()}")
PY
echo "wheels carried: $(cd bench/wheels && echo *.whl)"

echo "== bench/device_check.sh"
PYTHON=$PY OUT=$TMP/out COMERA_DEVICE_SITE=$TMP/site bash bench/device_check.sh
echo "device_check.sh exit status $? (1 is expected on CPU: the CUDA-only steps fail)"

echo "== the CUDA steps' code on the CPU"
export PYTHONPATH="$TMP/site:$PWD"
cpu_step() {  # cpu_step NAME SECONDS CMD...: as device_check.sh's steps, into the same table
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  timeout "$limit" "$@" > "$TMP/out/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$TMP/out/steps.tsv"
  echo "$name: exit $rc"
  tail -n 2 "$TMP/out/$name.log"
}
cpu_step warm_up 180 $PY -c "from bench.train_step_configs import warm_up; warm_up(); print('ok')"
cpu_step ddp_cpu 300 $PY -m bench.ddp_step --device cpu --devices 2 --steps 20 \
  --out "$TMP/out/ddp_cpu.json"
rm -rf "${DRYRUN_KEEP:=/tmp/comera-dryrun-out}" && cp -r "$TMP/out" "$DRYRUN_KEEP"

echo "== the steps (name, exit status, seconds) and what they could not import or call"
cat "$TMP/out/steps.tsv"
cat "$TMP/out/pip.log" 2>/dev/null
PATTERN="ImportError|ModuleNotFoundError|cannot import name|has no attribute|unexpected keyword"
PATTERN+="|SyntaxError|not supported between|No module named"
found=0
for log in "$TMP"/out/*.log; do
  if grep -E "$PATTERN" "$log" > "$TMP/hits"; then
    found=1
    echo "-- $(basename "$log"):"
    sort -u "$TMP/hits" | head -20
  fi
done
INTERPRETER="InterpreterError|only 0-dimensional arrays|OpCheckError"
for name in $(cut -f1 "$TMP/out/steps.tsv"); do  # a failed step must be the missing GPU
  rc=$(awk -v n="$name" '$1 == n {print $2}' "$TMP/out/steps.tsv")
  log=$TMP/out/$name.log
  [ "$rc" = 0 ] && continue
  grep -qE "needs a CUDA device" "$log" && continue
  errors=$(grep -E "^E +[A-Za-z_.]+(Error|Exception)" "$log" | sed -E 's/^E +//; s/\(.*//' \
    | sort | uniq -c | sort -rn)
  echo "-- $name failed (exit $rc); its errors by kind:"
  echo "${errors:-(none printed)}"
  grep -E "^(FAILED|ERROR) " "$log" | head -n 5
  if [ -n "$errors" ] && ! grep -E "^E +[A-Za-z_.]+(Error|Exception)" "$log" \
    | grep -vqE "$INTERPRETER"; then
    echo "   (all of them Triton's interpreter on the CPU: not counted)"
  else
    found=1
    tail -n 15 "$log"
  fi
done
[ "$found" = 0 ] && echo "dry run: every step imported and started (torch $TORCH)"
exit "$found"
