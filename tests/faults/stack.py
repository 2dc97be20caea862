"""The service as a user runs it, for fault tests: a private ``redis-server``, PostgreSQL,
``python -m service.cli api|worker|reaper`` processes, an HTTP client with an API key.

Everything is started with short leases and a fast reaper (``FAST``), so a lost worker or a
lost message is noticed in seconds. Each process runs in its own process group, so a test can
kill a worker and its child at once (``kill``), as an out-of-memory killer or a power cut
would. Pytest-free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.services import ROOT, RedisServer, clean_env, free_port, run_python, wait_for
from tests.helpers.specs import early_stage, finetune_stage, late_stage, mlp_run

__all__ = ["FAST", "SPEC", "RedisServer", "Stack", "api_key", "running", "wait_for"]

FAST = {  # a lease that survives a busy 2-core machine (a child importing torch can starve
    # its heartbeat thread for seconds), yet a lost worker is noticed within ~10 s
    "COMERA_LEASE_SECONDS": "10",
    "COMERA_HEARTBEAT_SECONDS": "1",
    "COMERA_REAPER_INTERVAL_SECONDS": "0.5",
    "COMERA_RETRY_BACKOFF_SECONDS": "0",
    "COMERA_REDRIVE_AFTER_SECONDS": "1",
    "COMERA_REDELIVER_AFTER_SECONDS": "3",
    "COMERA_FLUSH_SECONDS": "0.2",
}
# a small MLP: 40 steps in three stages, a checkpoint every 10 (about 20 KB each)
SPEC: dict[str, Any] = mlp_run(
    name="fault",
    schedule=[
        early_stage(steps=20, eval_every=10, lr={"cores": 0.003, "gates": 0.01, "others": 0.003}),
        late_stage(steps=10, target_ratio=0.5),
        finetune_stage(steps=10),
    ],
    training={"batch_size": 16, "log_every": 5, "seed": 0},
)
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def api_key(env: dict[str, str]) -> str | None:
    """A key for tenant ``default`` from ``comera keys create`` (None before API keys exist)."""
    out = run_python("-m", "service.cli", "keys", "create", "--tenant", "default", env=env)
    if out.returncode != 0:
        if "No such command" in out.stderr:
            return None
        raise AssertionError(f"keys create failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


class Stack:
    """The processes of one test, under ``tmp`` (logs in ``tmp/*.log``)."""

    def __init__(self, tmp: Path, db_url: str, broker: str, **extra: str) -> None:
        self.tmp, self.db_url = tmp, db_url
        self.env = clean_env(
            tmp / "home",
            COMERA_DATABASE_URL=db_url,
            COMERA_BROKER_URL=broker,
            COMERA_QUEUE=f"fault.{free_port()}",
            **{**FAST, **extra},
        )
        self.procs: dict[str, subprocess.Popen] = {}
        self.headers: dict[str, str] = {}
        self._pumps: list[threading.Thread] = []

    def start(
        self,
        name: str,
        args: list[str],
        *,
        wrap: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        pipe: bool = False,
    ) -> subprocess.Popen:
        """``python -m service.cli ARGS`` (after ``wrap``, e.g. ``prlimit …``) in its own
        process group. ``pipe``: its output goes through a pipe to the log (a process with a
        file size limit cannot write a growing log file itself)."""
        log = (self.tmp / f"{name}.log").open("ab")
        cmd = [*wrap, sys.executable, "-m", "service.cli", *args]
        proc = subprocess.Popen(
            cmd,
            env=env or self.env,
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.PIPE if pipe else log,
            stderr=subprocess.STDOUT,
        )
        if pipe:
            pump = threading.Thread(target=self._pump, args=(proc, log), daemon=True)
            pump.start()
            self._pumps.append(pump)
        else:
            log.close()
        self.procs[name] = proc
        return proc

    @staticmethod
    def _pump(proc: subprocess.Popen, log: Any) -> None:
        with log:
            for line in iter(proc.stdout.readline, b""):
                log.write(line)
                log.flush()

    def api(self, env: dict[str, str] | None = None) -> httpx.Client:
        """Start the API, wait until it is ready, and return a client with an API key."""
        port = free_port()
        self.start("api", ["api", "--port", str(port)], env=env)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=90)
        with ThreadPoolExecutor(1) as pool:
            created = pool.submit(api_key, self.env)  # in the store, while the API starts
            wait_for(lambda: self._ready(client), 120, "the API", self.logs)
            key = created.result()
        if key is not None:
            client.headers["Authorization"] = f"Bearer {key}"
        return client

    def _ready(self, client: httpx.Client) -> bool:
        if self.procs["api"].poll() is not None:
            raise AssertionError(f"the API exited\n{self.logs()}")
        try:
            return client.get("/v1/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def worker(self, name: str, **kwargs: Any) -> subprocess.Popen:
        return self.start(name, ["worker", "--hostname", f"{name}{free_port()}@%h"], **kwargs)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """``sig`` to the process group of ``name`` (a worker: its parent and its child)."""
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def pause(self, name: str) -> None:
        """SIGSTOP to the process group of ``name``, returning once all of it has stopped: a
        worker with a one-device job trains in its pool child, in that group, so nothing of
        the job runs until :meth:`resume` or :meth:`kill` and a test can look at the job and
        act on what it saw (a data-parallel job's launcher runs in a session of its own)."""
        pgid, deadline = self.procs[name].pid, time.monotonic() + 10
        os.killpg(pgid, signal.SIGSTOP)
        while not all(_stopped(pid) for pid in _group(pgid)):  # delivered, not at once
            assert time.monotonic() < deadline, f"{name} did not stop"
            time.sleep(0.005)

    def resume(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGCONT)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                with suppress(ProcessLookupError):  # a paused group handles it too
                    os.killpg(proc.pid, signal.SIGCONT)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for pump in self._pumps:
            pump.join(timeout=5)

    # -- the API, as a user calls it --------------------------------------------------------
    def submit(self, client: httpx.Client, spec: dict[str, Any], key: str) -> dict[str, Any]:
        r = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
        assert r.status_code == 202, r.text
        return r.json()

    def wait_state(
        self,
        client: httpx.Client,
        job_id: str,
        timeout: float = 150,
        states: tuple[str, ...] = TERMINAL,
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = client.get(f"/v1/jobs/{job_id}").json()
            return job if job["state"] in states else None

        return wait_for(reached, timeout, f"job {job_id} to reach {states}", self.logs)

    def events(self, client: httpx.Client, job_id: str, kind: str) -> list[dict[str, Any]]:
        r = client.get(f"/v1/jobs/{job_id}/events", params={"kind": kind, "limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()["items"]


def _stopped(pid: int) -> bool:
    """``pid`` is stopped (``/proc/PID/stat`` state ``T``), dead or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "TtZX"


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(int(entry.name))
    return out


@contextmanager
def running(tmp: Path, db_url: str, broker: str, **extra: str) -> Iterator[Stack]:
    stack = Stack(tmp, db_url, broker, **extra)
    try:
        yield stack
    finally:
        stack.stop()
