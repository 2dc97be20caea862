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
from tests.helpers.services import clean_env, free_port, start_cli

pytestmark = [pytest.mark.slow, SERVICES]


def _children() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        if fields[0] != "Z":
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> set[int]:
    tree, out, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


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
            tree.update(_descendants(proc.pid))
            return any(_descendants(child) for child in _children().get(proc.pid, []))

        _wait(worker_started, 60, "the worker's pool child", log)
        tree.update(_descendants(proc.pid))

        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as a service manager does
        status = proc.wait(timeout=90)
        _wait(lambda: not any(_alive(p) for p in tree), 15, "every child to exit", log)
        assert status == 128 + signal.SIGTERM, log.read_text()[-3000:]
        assert "Finished server process" in log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in tree:  # what the old code left behind (started by this test)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
