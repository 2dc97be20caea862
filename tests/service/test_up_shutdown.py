"""``comera up`` stopped by a service manager (SIGTERM, as ``docker stop`` or systemd send it)
leaves nothing running: its Celery worker and that worker's pool child stop with it, as with
Ctrl-C (SIGINT). A real ``python -m service.cli up`` process, embedded store and broker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.groups import SERVICES
from tests.helpers.proctree import alive, children, cmdline, descendants
from tests.helpers.services import clean_env, free_port, start_cli

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


def test_sigterm_stops_comera_up_and_its_worker(tmp_path):
    port, log = free_port(), tmp_path / "up.log"
    proc = start_cli(["up", "--port", str(port)], clean_env(tmp_path / "home"), log)
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

        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as a service manager does
        status = proc.wait(timeout=90)
        _wait(lambda: not any(alive(p) for p in tree), 15, "every child to exit", log)
        assert status == 128 + signal.SIGTERM, log.read_text()[-3000:]
        assert "Finished server process" in log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in tree:  # what the old code left behind (started by this test)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
