"""Real service processes for tests: a tiny job spec, free ports, ``service.cli`` children.

Children run as a user runs them (``python -m service.cli up|api|worker``) in their own
process group, with every inherited ``COMERA_*`` variable removed; ``stop`` sends SIGINT (as
Ctrl-C) and fails the test, with the stacks of what it waited on, if they have not exited
within ``STOP_S``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.helpers.proctree import alive, cmdline, descendants
from tests.helpers.specs import (
    api_job,
    early_stage,
    finetune_stage,
    late_stage,
    mlp_model,
    synthetic_dataset,
)

__all__ = [
    "ROOT",
    "RedisServer",
    "TINY_JOB",
    "auth_headers",
    "clean_env",
    "free_port",
    "make_key",
    "read_key",
    "run_python",
    "start_cli",
    "stop",
    "train_cli",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]
# a tiny MLP, 70 steps in three stages: seconds of training on 2 cores
TINY_JOB = api_job(
    name="tiny-mlp",
    labels={"suite": "e2e"},
    model=mlp_model(64, 64),
    dataset=synthetic_dataset(
        "mlp", n_train=1500, n_valid=300, params={"shape": [8, 8], "num_classes": 3}
    ),
    compression={"method": "comera", "max_rank": 6, "min_size": 256, "shrink_every": 10},
    schedule=[
        early_stage(
            steps=40, gamma=0.05, eval_every=20, lr={"cores": 0.003, "gates": 0.01, "others": 0.001}
        ),
        late_stage(steps=20, target_ratio=0.5, lr={"cores": 0.002, "gates": 0.01, "others": 0.001}),
        finetune_stage(steps=10, lr={"cores": 0.001, "gates": 0.0, "others": 0.001}),
    ],
    training={"batch_size": 32, "seed": 0, "log_every": 5},
    checkpointing={"every_n_steps": 25, "keep": 2},
)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    logs: Callable[[], str] = str,
    every: float = 0.2,
) -> Any:
    """``predicate()``'s first true value, polled every ``every`` seconds; after ``timeout``
    seconds an AssertionError naming ``what``, with ``logs()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``redis-server`` on a free port, keeping nothing: a restart empties every queue."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        try:
            wait_for(lambda: self._ping(client), 15, "redis-server")
        finally:
            client.close()

    @staticmethod
    def _ping(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without ``COMERA_*``, plus ``COMERA_HOME``, one planner
    child per API process, and ``extra``. (A test's service plans a job at a time; each
    planner child is a spawn and a torch import, ~3 s of a core, and the default two of them
    made every API start of a fault test cost twice that on a 2-core machine.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env.update({"COMERA_HOME": str(home), "COMERA_PLANNER_PROCESSES": "1", **extra})
    return env


def start_cli(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``python -m service.cli ARGS`` in a new process group, output to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def read_key(home: Path, timeout: float = 120.0) -> str:
    """The first API key ``comera up`` wrote to ``home/api_key`` (waits for it)."""
    path, deadline = home / "api_key", time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        if time.monotonic() > deadline:
            raise AssertionError(f"no API key at {path}")
        time.sleep(0.2)
    return path.read_text().strip()


def run_python(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python *args`` (``-m module ...``, ``-c code ...``, a script) run to its end in
    ``cwd``, its output captured as text; ``check``: raise if it exits non-zero."""
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def train_cli(
    workdir: Path,
    job: dict[str, Any],
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m engine.train --config workdir/job.json --out out *args``, ``job`` written
    to that file first."""
    config = workdir / "job.json"
    config.write_text(json.dumps(job))
    cmd = ["-m", "engine.train", "--config", str(config), "--out", str(out), *args]
    return run_python(*cmd, env=env, timeout=timeout)


def make_key(env: dict[str, str], tenant: str = "default", *scopes: str) -> str:
    """A key made as an operator makes one: ``python -m service.cli keys create``."""
    args = [arg for s in scopes for arg in ("--scope", s)]
    cmd = ["-m", "service.cli", "keys", "create", "--tenant", tenant, *args]
    return run_python(*cmd, env=env, check=True).stdout.strip()


def auth_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


STOP_S = 30.0  # `comera up` stops in 5-7 s on a loaded 2-core host; a test's limit is 60 s


def stop(procs: list[subprocess.Popen], logs: list[Path], timeout: float = STOP_S) -> None:
    """SIGINT to each process group, as Ctrl-C sends it, and wait ``timeout`` s for all.

    A service still running then is stuck, not slow: every thread's stack of it and of the
    Celery workers it started goes to its log (SIGUSR1: ``comera up`` and Celery's main
    process both write them), everything it started is killed, and the test fails with the
    log's tail, so a stuck shutdown on CI says where it waited."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
    deadline, stuck = time.monotonic() + timeout, []
    for p, log in zip(procs, logs, strict=True):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck.append((p, log, descendants(p.pid)))
    for p, _, started in stuck:
        for pid in [p.pid, *started]:
            if pid == p.pid or "celery" in cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
    if stuck:
        time.sleep(3)  # the stacks are written
    for p, _, started in stuck:
        for pid in [p.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait()
    left = {pid for _, _, started in stuck for pid in started}
    deadline = time.monotonic() + 10  # SIGKILL is delivered, not waited for
    while any(alive(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    if stuck:
        tails = "\n".join(
            f"{p.args[1:]} did not stop within {timeout:g} s of SIGINT; {log.name} ends:\n"
            + log.read_text(errors="replace")[-12000:]
            for p, log, _ in stuck
        )
        raise AssertionError(tails)
