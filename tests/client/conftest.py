"""Fixtures of the client tests: one real ``comera up`` for the package, and one finished job.

The service runs as the user runs it (``python -m service.cli up`` on a free port, SQLite store
and broker under a temporary ``COMERA_HOME``, one local Celery worker); it is shared by every
test in ``tests/client`` and stopped (SIGINT, as Ctrl-C) after the last one.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from api_schemas import JobPublic
from client import ComeraClient

ROOT = Path(__file__).resolve().parents[2]
# a tiny MLP, 70 steps in three stages (as tests/service/test_end_to_end.py)
SPEC = {
    "name": "client-mlp",
    "labels": {"suite": "client"},
    "model": {"arch": "mlp", "config": {"hidden": [64, 64]}},
    "dataset": {"source": "synthetic", "generator": "mlp", "n_train": 1500, "n_valid": 300,
                "params": {"shape": [8, 8], "num_classes": 3}},
    "compression": {"method": "comera", "max_rank": 6, "min_size": 256, "shrink_every": 10},
    "schedule": [
        {"kind": "early", "steps": 40, "gamma": 0.05, "eval_every": 20,
         "lr": {"cores": 0.003, "gates": 0.01, "others": 0.001}},
        {"kind": "late", "steps": 20, "target_ratio": 0.5,
         "lr": {"cores": 0.002, "gates": 0.01, "others": 0.001}},
        {"kind": "finetune", "steps": 10, "lr": {"cores": 0.001, "gates": 0.0, "others": 0.001}},
    ],
    "training": {"batch_size": 32, "seed": 0, "log_every": 5},
    "checkpointing": {"every_n_steps": 25, "keep": 2},
}  # fmt: skip


def spec(**changes: object) -> dict:
    out = copy.deepcopy(SPEC)
    out.update(changes)
    return out


@dataclass(frozen=True)
class Server:
    url: str
    home: Path
    log: Path

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("comera")
    port, home, log = _free_port(), base / "home", base / "up.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env["COMERA_HOME"] = str(home)
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "up", "--port", str(port)],
                            env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    srv = Server(f"http://127.0.0.1:{port}", home, log)
    try:
        with ComeraClient(srv.url) as c:
            deadline = time.monotonic() + 120
            while not c.ready():
                assert proc.poll() is None, srv.tail()
                assert time.monotonic() < deadline, "comera up not ready:\n" + srv.tail()
                time.sleep(0.3)
        yield srv
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def client(server: Server):
    with ComeraClient(server.url) as c:
        yield c


@dataclass(frozen=True)
class FinishedJob:
    submitted: JobPublic  # what submit returned
    final: JobPublic  # after wait


@pytest.fixture(scope="package")
def finished_job(server: Server) -> FinishedJob:
    """One job submitted through the client and waited for (about 10-20 s)."""
    with ComeraClient(server.url) as c:
        submitted = c.submit(SPEC, idempotency_key="client-tests-1")
        try:
            final = c.wait(submitted.id, timeout=240, poll=0.5)
        except TimeoutError:
            raise AssertionError(server.tail()) from None
    assert final.state == "SUCCEEDED", (final.error, server.tail())
    return FinishedJob(submitted, final)
