#!/usr/bin/env bash
# Install the service into .venv, then run the main job on the embedded default: `comera up`
# (SQLite store, SQLite-backed broker, one local worker), submit the example job over HTTP
# (synthetic sentence pairs, early + late + finetune stages), follow it, download the
# compressed model (sha256 checked) and print its compression report.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
spec="${1:-examples/service/nli_job.json}"
rm -rf runs/service
exec .venv/bin/python examples/service/run_embedded.py "$spec" --home runs/service
