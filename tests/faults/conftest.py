"""Fixtures of the fault tests: a private Redis and a stack on a migrated PostgreSQL database
(``pg_url``, from ``tests/conftest.py``)."""

from __future__ import annotations

import shutil

import pytest

from tests.faults.stack import RedisServer, running


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
def stack(tmp_path, pg_url, redis_server):
    with running(tmp_path, pg_url, redis_server.url) as s:
        yield s
