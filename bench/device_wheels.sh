#!/usr/bin/env bash
# The packages bench/device_check.sh needs that the GPU machine's image lacks, as wheels in
# bench/wheels/ (the GPU machine has no network). Run on a machine with the package index.
#
# The image (Python 3.12, torch 2.11 with CUDA, triton 3.6) already holds pytest, hypothesis,
# safetensors, transformers, tokenizers, numpy and scipy, at its own versions: carrying them
# again would install a second copy next to the image's. It lacks galore-torch (the GaLore
# baseline), tensorly and tensorly-torch (the TensorLy-Torch baseline): all three are pure
# Python (py3-none-any), downloaded for CPython 3.12 with --no-deps; what they require (torch,
# transformers, numpy, scipy) is the image's. bitsandbytes (galore-torch's 8-bit optimizer,
# unused) is left out: bench.common.galore_adamw stands a stub in for it. device_check.sh
# installs them with --no-deps, so nothing pulls a second torch, and one wheel for another
# Python would stop the whole install: every wheel saved here is checked to be py3-none-any
# or cp312.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf bench/wheels && mkdir -p bench/wheels
PIP_CONSTRAINT= $PY -m pip download -q --no-deps -d bench/wheels --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 \
  galore-torch==1.0 tensorly==0.10.0 tensorly-torch==0.5.0
for wheel in bench/wheels/*.whl; do
  case "$(basename "$wheel")" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl | *-cp312-*.whl) ;;
    *) echo "not for CPython 3.12: $wheel" >&2; exit 1 ;;
  esac
done
ls bench/wheels
du -sh bench/wheels
