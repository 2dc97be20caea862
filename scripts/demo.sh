#!/usr/bin/env bash
# Install the engine into .venv, then run the main job: one CoMERA training job from a JSON
# config (synthetic sentence pairs, early + late + finetune stages) with its report.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
config="${1:-examples/engine/nli_transformer.json}"
out="${2:-runs/$(basename "$config" .json)}"
rm -rf "$out"
exec .venv/bin/python -m engine.train --config "$config" --out "$out"
