"""Suite-wide fixtures and the rule that CI never skips for a missing service.

Tests of the store, the broker, the worker, the dashboard and the kernels skip with a
reason when PostgreSQL, Redis, Chromium or Triton are missing, so a developer without them
can still run the rest. ``scripts/test.sh`` (what CI runs) sets
``COMERA_TEST_REQUIRE_SERVICES=1``: there such a skip is a failure, so a broken install or a
stopped server cannot pass as green. Only skips that say a GPU is needed remain skips.

The store and API fixtures live here because the service, worker and fault tests share them;
their modules are imported when a test asks for one, so engine-only runs stay light.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one of several test processes sharing the cores (scripts/test.sh runs three): one thread
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
PG_SKIP = "PostgreSQL is not reachable at 127.0.0.1:5432"

if TYPE_CHECKING:
    from tests.service.api_helpers import Api


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    if os.environ.get("PYTEST_XDIST_WORKER") and torch.get_num_threads() != 1:
        # a test that raised this process's threads (a benchmark's main sets its --threads)
        # must not leave every later test of the process on more threads than the cores hold
        torch.set_num_threads(1)


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


# --- store and HTTP API fixtures (service, worker and fault tests) ---------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh migrated database, once per backend."""
    from tests.helpers.db import migrated_postgres, migrated_sqlite, postgres_available

    if request.param == "sqlite":
        with migrated_sqlite(tmp_path) as url:
            yield url
    else:
        if not postgres_available():
            pytest.skip(PG_SKIP)
        with migrated_postgres() as url:
            yield url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh migrated PostgreSQL database (skips where the server is not reachable)."""
    from tests.helpers.db import migrated_postgres, postgres_available

    if not postgres_available():
        pytest.skip(PG_SKIP)
    with migrated_postgres() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """A fresh migrated SQLite database in the test's directory."""
    from tests.helpers.db import migrated_sqlite

    with migrated_sqlite(tmp_path) as url:
        yield url


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[Api]:
    """The HTTP API on a real migrated store, once per backend (``tests.service.api_helpers``)."""
    from tests.service.api_helpers import serve_api

    yield from serve_api(db_url, tmp_path)


@pytest.fixture
def api_lite(sqlite_url: str, tmp_path: Path) -> Iterator[Api]:
    """The HTTP API on SQLite only, for tests where the backend does not matter."""
    from tests.service.api_helpers import serve_api

    yield from serve_api(sqlite_url, tmp_path)
