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
# PostgreSQL, Redis, Chromium and Triton are part of the suite: a test that would skip for
# want of one fails instead (tests/conftest.py); set 0 to let them skip on a bare laptop
export COMERA_TEST_REQUIRE_SERVICES="${COMERA_TEST_REQUIRE_SERVICES:-1}"
# the tree is formatted and linted as part of the suite
.venv/bin/ruff format --check --quiet . || { echo "ruff format: files above need formatting"; exit 1; }
.venv/bin/ruff check --quiet .
# three test processes on the two cores (tests/conftest.py gives each one thread): many tests
# wait on the servers, workers and child processes they start, and a third process fills that
# time (clean clones on 2 cores: 607 s with three; the run before with two, before some tests
# were trimmed, 731 s); the 15 slowest tests are listed, so a test that grows shows in the log.
# 'loadgroup': the tests of one xdist group run one after another in one process (the tests
# that start service stacks, and those that launch training processes, each take turns:
# tests/helpers/groups.py); the rest spread.
# The few 'solo' tests start several heavy processes each: they run one at a time afterwards,
# where the suite's 60 s limit holds them with room (pytest's status 5: nothing was selected)
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
status=0
"${pytest[@]}" -n "${COMERA_TEST_WORKERS:-3}" --dist loadgroup --durations=15 -m "not solo" "$@" ||
  status=$?
[ "$status" -eq 5 ] && status=0
solo=0
"${pytest[@]}" -n 0 --durations=10 -m solo "$@" || solo=$?
[ "$solo" -eq 5 ] && solo=0
[ "$status" -ne 0 ] && exit "$status"
exit "$solo"
