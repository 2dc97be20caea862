"""Fixtures of the fault tests: a migrated PostgreSQL database, a private Redis, a stack."""

from __future__ import annotations

import shutil

import pytest

from tests.faults.stack import RedisServer, running
from tests.helpers.db import migrated_postgres, postgres_available


@pytest.fixture
def pg_db():
    if not postgres_available():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with migrated_postgres() as url:
        yield url


@pytest.fixture
def redis_server():
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary")
    server = RedisServer()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def stack(tmp_path, pg_db, redis_server):
    with running(tmp_path, pg_db, redis_server.url) as s:
        yield s
