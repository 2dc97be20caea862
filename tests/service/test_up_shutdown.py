"""``comera up`` stopped by a service manager (SIGTERM, as ``docker stop`` or systemd send it)
leaves nothing running: its Celery worker and that worker's pool child stop with it, as with
Ctrl-C (SIGINT), and the job it was running waits for the next start as its next attempt, with
its message in the queue. A real ``python -m service.cli up`` process, embedded store and
broker."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers.groups import SERVICES
from tests.helpers.proctree import alive, children, cmdline, descendants
from tests.helpers.services import (
    TINY_JOB,
    auth_headers,
    clean_env,
    free_port,
    read_key,
    start_cli,
)

pytestmark = [pytest.mark.slow, SERVICES]


def _wait(predicate, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/v1/healthz").status_code == 200
    except httpx.TransportError:
        return False


def _running(port: int, home: Path, log: Path) -> str:
    """A long job submitted and seen training (its fifth step)."""
    job = {**TINY_JOB, "schedule": [{**TINY_JOB["schedule"][0], "steps": 100_000}]}
    headers = {**auth_headers(read_key(home)), "Idempotency-Key": str(uuid.uuid4())}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=headers) as c:
        resp = c.post("/v1/jobs", json={**job, "name": "long"})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]

        def training() -> bool:
            got = c.get(f"/v1/jobs/{job_id}").json()
            return got["state"] == "RUNNING" and got["progress"]["step"] >= 5

        _wait(training, 90, "the job to train", log)
    return job_id


def test_sigterm_stops_comera_up_and_its_worker_and_requeues_the_job(tmp_path):
    port, log, home = free_port(), tmp_path / "up.log", tmp_path / "home"
    proc = start_cli(["up", "--port", str(port)], clean_env(home), log)
    tree: set[int] = set()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            _wait(lambda: _ready(client) or proc.poll() is not None, 120, "comera up", log)
        assert proc.poll() is None, log.read_text()

        def worker_started() -> bool:  # the Celery worker and its pool child
            tree.update(descendants(proc.pid))
            return any(descendants(child) for child in children().get(proc.pid, []))

        _wait(worker_started, 60, "the worker's pool child", log)
        tree.update(descendants(proc.pid))

        # SIGUSR1 writes every thread's stack to the log and stops nothing: `comera up`'s
        # (faulthandler) and its Celery worker's (Celery's own), what a stuck stop is
        # diagnosed with (tests.helpers.services.stop)
        (celery,) = [p for p in children()[proc.pid] if "celery" in cmdline(p)]
        for pid in (proc.pid, celery):
            os.kill(pid, signal.SIGUSR1)
        _wait(lambda: "(most recent call first)" in log.read_text(), 15, "up's stacks", log)
        _wait(lambda: "MainThread\n=====" in log.read_text(), 15, "the worker's stacks", log)
        assert "in run" in log.read_text()  # uvicorn's server loop, as faulthandler names it
        assert proc.poll() is None and alive(celery), log.read_text()[-3000:]

        job_id = _running(port, home, log)
        tree.update(descendants(proc.pid))
        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as a service manager does
        status = proc.wait(timeout=90)
        _wait(lambda: not any(alive(p) for p in tree), 15, "every child to exit", log)
        assert status == 128 + signal.SIGTERM, log.read_text()[-3000:]
        assert "Finished server process" in log.read_text()
        # preempted, and its next attempt waits with its message queued: the stopping worker
        # took that message in its last moments, and sent it back instead of claiming the job
        # (which left it STARTING, its lease to expire minutes later, an attempt spent)
        with sqlite3.connect(home / "comera.db") as db:
            state = db.execute("SELECT state, attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()
        assert state == ("QUEUED", 2), log.read_text()[-3000:]
        with sqlite3.connect(home / "broker.db") as db:
            bodies = db.execute("SELECT payload FROM kombu_message WHERE visible").fetchall()
        assert [json.loads(b)["headers"]["id"] for (b,) in bodies] == [f"{job_id}:2"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in tree:  # what the old code left behind (started by this test)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
