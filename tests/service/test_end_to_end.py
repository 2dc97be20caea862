"""The whole service with real processes: submit over HTTP, a Celery worker trains, download.

Two deployments of the same code: ``comera up`` (embedded: SQLite store, SQLite-backed broker,
local worker) and the distributed one (``comera api`` + ``comera worker`` on PostgreSQL and
Redis). Each runs a small CoMERA job to SUCCEEDED, then checks what a user sees: metric and
rank series, a compressed checkpoint whose bytes hash to the advertised sha256 and which the
engine loads into a model, and a report measured on that file.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.db import migrated_postgres, postgres_available

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "e2e-mlp",
    "labels": {"suite": "e2e"},
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "service.cli", *cmd], env=env, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _ready(client: httpx.Client):
    try:
        return client.get("/v1/readyz").status_code == 200
    except httpx.TransportError:
        return False


def _run_job_and_check(client: httpx.Client, logs: list[Path]) -> None:
    r = client.post("/v1/jobs", json=SPEC)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.headers["location"].endswith(f"/v1/jobs/{job_id}")

    def finished():
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    try:
        job = _wait(finished, 240, "the job to finish")
    except AssertionError:
        raise AssertionError("\n".join(p.read_text()[-3000:] for p in logs)) from None
    assert job["state"] == "SUCCEEDED", job.get("error")
    assert job["progress"]["step"] == 70
    assert job["compression"]["current_ratio"] > 1

    metrics = client.get(f"/v1/jobs/{job_id}/metrics", params={"keys": "loss"}).json()
    steps = [p["step"] for p in metrics["series"][0]["points"]]
    assert steps == sorted(set(steps)) and steps[-1] == 70  # no duplicates, up to the end
    ranks = client.get(f"/v1/jobs/{job_id}/ranks").json()["points"]
    assert {p["tensor"] for p in ranks} and all(p["params"] <= p["dense"] for p in ranks)

    ckpts = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    export = next(c for c in ckpts if c["kind"] == "export")
    body = client.get(f"/v1/jobs/{job_id}/checkpoints/{export['id']}/content")
    assert body.status_code == 200
    digest = hashlib.sha256(body.content).hexdigest()
    assert digest == export["sha256"] and body.headers["etag"] == f'"sha256:{digest}"'
    report = client.get(f"/v1/jobs/{job_id}/report").json()
    assert report["file_bytes"] == len(body.content)
    assert report["params"] < report["params_dense"]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env.update(COMERA_HOME=str(home), **extra)
    return env


def test_embedded_comera_up_runs_a_job_end_to_end(tmp_path):
    port = _free_port()
    log = tmp_path / "up.log"
    proc = _start(["up", "--port", str(port)], _env(tmp_path / "home"), log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait(lambda: _ready(client) or proc.poll() is not None, 120, "comera up")
            assert proc.poll() is None, log.read_text()
            _run_job_and_check(client, [log])
    finally:
        _stop([proc])
    assert (tmp_path / "home" / "comera.db").exists()


def test_distributed_api_and_worker_on_postgres_and_redis(tmp_path):
    if not postgres_available():
        pytest.skip("PostgreSQL is not reachable")
    port = _free_port()
    with migrated_postgres() as db:
        env = _env(tmp_path / "home", COMERA_DATABASE_URL=db,
                   COMERA_BROKER_URL="redis://127.0.0.1:6379/11",
                   COMERA_QUEUE=f"e2e.{port}")  # fmt: skip
        logs = [tmp_path / "api.log", tmp_path / "worker.log"]
        procs = [_start(["api", "--port", str(port)], env, logs[0]),
                 _start(["worker", "--hostname", f"e2e{port}@%h"], env, logs[1])]  # fmt: skip
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                _wait(lambda: _ready(client), 120, "the API")
                _run_job_and_check(client, logs)
        finally:
            _stop(procs)
