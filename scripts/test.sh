#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
