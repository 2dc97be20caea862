#!/usr/bin/env bash
# Install the engine into .venv, then run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/python -m engine.demo "$@"
