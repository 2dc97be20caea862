"""Fixtures of the client tests: one real ``comera up`` for the package, and one finished job.

The service runs as the user runs it (``python -m service.cli up`` on a free port, SQLite store
and broker under a temporary ``COMERA_HOME``, one local Celery worker); it is shared by every
test in ``tests/client`` and stopped (SIGINT, as Ctrl-C) after the last one.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from api_schemas import JobPublic
from client import ComeraClient
from tests.helpers.services import TINY_JOB, clean_env, free_port, read_key, start_cli, stop

SPEC = {**TINY_JOB, "name": "client-mlp", "labels": {"suite": "client"}}


def spec(**changes: object) -> dict:
    out = copy.deepcopy(SPEC)
    out.update(changes)
    return out


@dataclass(frozen=True)
class Server:
    url: str
    home: Path
    log: Path
    key: str = ""

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("comera")
    port, home, log = free_port(), base / "home", base / "up.log"
    proc = start_cli(["up", "--port", str(port)], clean_env(home), log)
    srv = Server(f"http://127.0.0.1:{port}", home, log)
    try:
        with ComeraClient(srv.url) as c:
            deadline = time.monotonic() + 120
            while not c.ready():
                assert proc.poll() is None, srv.tail()
                assert time.monotonic() < deadline, "comera up not ready:\n" + srv.tail()
                time.sleep(0.3)
        yield Server(srv.url, home, log, read_key(home))
    finally:
        stop([proc], [log])


@pytest.fixture
def client(server: Server):
    with ComeraClient(server.url, api_key=server.key) as c:
        yield c


@dataclass(frozen=True)
class FinishedJob:
    submitted: JobPublic  # what submit returned
    final: JobPublic  # after wait


@pytest.fixture(scope="package")
def finished_job(server: Server) -> FinishedJob:
    """One job submitted through the client and waited for (about 10-20 s)."""
    with ComeraClient(server.url, api_key=server.key) as c:
        submitted = c.submit(SPEC, idempotency_key="client-tests-1")
        try:
            final = c.wait(submitted.id, timeout=240, poll=0.5)
        except TimeoutError:
            raise AssertionError(server.tail()) from None
    assert final.state == "SUCCEEDED", (final.error, server.tail())
    return FinishedJob(submitted, final)
