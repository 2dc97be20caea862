#!/usr/bin/env bash
# Install the service into .venv, then run the main job on the embedded default: `comera up`
# (SQLite store, SQLite-backed broker, one local worker), submit the example job over HTTP
# (synthetic sentence pairs, early + late + finetune stages), follow it, download the
# compressed model (sha256 checked) and print what it got: accuracy, the tensorized layers'
# compression and the whole model's.  bash scripts/demo.sh [SPEC] [--baseline]: --baseline
# also trains the dense twin (about half again the time) and prints its accuracy beside.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
rm -rf runs/service
exec .venv/bin/python examples/service/run_embedded.py "$@" --home runs/service
