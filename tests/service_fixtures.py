"""Database fixtures shared by the service and worker tests (imported by their conftests)."""

from __future__ import annotations

import pytest

from tests.helpers.db import migrated_postgres, migrated_sqlite, postgres_available


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh migrated database, once per backend."""
    if request.param == "sqlite":
        with migrated_sqlite(tmp_path) as url:
            yield url
    else:
        if not postgres_available():
            pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
        with migrated_postgres() as url:
            yield url


@pytest.fixture
def pg_url():
    if not postgres_available():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with migrated_postgres() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path):
    with migrated_sqlite(tmp_path) as url:
        yield url
