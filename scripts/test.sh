#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
# the dashboard's browser test drives Debian's chromium (Playwright never downloads a browser)
if ! command -v chromium >/dev/null; then
  sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
