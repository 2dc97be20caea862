"""Suite-wide fixtures and the rule that CI never skips for a missing service.

Tests of the store, the broker, the worker, the dashboard and the kernels skip with a
reason when PostgreSQL, Redis, Chromium or Triton are missing, so a developer without them
can still run the rest. ``scripts/test.sh`` (what CI runs) sets
``COMERA_TEST_REQUIRE_SERVICES=1``: there such a skip is a failure, so a broken install or a
stopped server cannot pass as green. Only skips that say a GPU is needed remain skips.
"""

import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one of several test processes sharing the cores (scripts/test.sh runs two): one thread
    # each, here and in the processes the tests start, so they do not wait on each other
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

# reasons of the skips that stand for a missing service or tool (see the test modules)
SERVICE_SKIPS = (
    "PostgreSQL is not reachable",
    "redis-server",
    "chromium is absent",
    "Triton kernels cannot run",
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("COMERA_TEST_REQUIRE_SERVICES") != "1":
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    if any(s in reason for s in SERVICE_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"required (COMERA_TEST_REQUIRE_SERVICES=1) but missing: {reason}"
