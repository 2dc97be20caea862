#!/usr/bin/env bash
# The packages bench/device_check.sh needs beyond PyTorch and Triton, as wheels in bench/wheels/
# (the GPU machine has no network). Run on a machine with the package index; versions are the
# project's pins. bitsandbytes is left out (too large to carry; galore-torch's 8-bit optimizer
# is not used): bench.common.galore_adamw stands a stub in for it where it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf bench/wheels && mkdir -p bench/wheels
$PY -m pip download -q --no-deps -d bench/wheels --only-binary=:all: --python-version 3.11 \
  pytest==9.2.0 pluggy iniconfig packaging hypothesis==6.155.2 sortedcontainers attrs \
  safetensors==0.8.0 galore-torch==1.0 tensorly==0.10.0 tensorly-torch==0.5.0 \
  transformers==5.24.0 huggingface-hub tokenizers==0.23.3 regex tqdm pyyaml filelock fsspec \
  typing-extensions numpy==2.4.6 scipy
du -sh bench/wheels
