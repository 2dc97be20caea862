"""The whole service with real processes: submit over HTTP, a Celery worker trains, download.

Two deployments of the same code: ``comera up`` (embedded: SQLite store, SQLite-backed broker,
local worker) and the distributed one (``comera api`` + ``comera worker`` on PostgreSQL and
Redis). Each runs a small CoMERA job to SUCCEEDED, then checks what a user sees: metric and
rank series, a compressed checkpoint whose bytes hash to the advertised sha256 and which the
engine loads into a model, and a report measured on that file.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import httpx
import pytest

from api_schemas import JobCreate
from api_schemas.engine_spec import to_engine
from engine.export import load_compressed
from tests.helpers.db import migrated_postgres, postgres_available
from tests.helpers.groups import SERVICES
from tests.helpers.metrics import validation_metrics
from tests.helpers.services import (
    TINY_JOB,
    auth_headers,
    clean_env,
    free_port,
    make_key,
    read_key,
    start_cli,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slow, SERVICES]
SPEC = {**TINY_JOB, "name": "e2e-mlp"}


def _ready(client: httpx.Client):
    try:
        return client.get("/v1/readyz").status_code == 200
    except httpx.TransportError:
        return False


def _run_job_and_check(client: httpx.Client, logs: list[Path], workdir: Path) -> None:
    r = client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.headers["location"].endswith(f"/v1/jobs/{job_id}")

    def finished():
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    try:
        job = wait_for(finished, 240, "the job to finish")
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
    url = f"/v1/jobs/{job_id}/checkpoints/{export['id']}/content"
    size = int(client.head(url).headers["content-length"])
    first = client.get(url, headers={"Range": f"bytes=0-{size // 2 - 1}"})
    rest = {"Range": f"bytes={size // 2}-", "If-Range": first.headers["etag"]}
    second = client.get(url, headers=rest)
    assert first.status_code == second.status_code == 206
    assert second.headers["content-range"] == f"bytes {size // 2}-{size - 1}/{size}"
    content = first.content + second.content
    digest = hashlib.sha256(content).hexdigest()
    assert digest == export["sha256"] and first.headers["etag"] == f'"sha256:{digest}"'
    report = client.get(f"/v1/jobs/{job_id}/report").json()
    assert report["file_bytes"] == len(content)
    assert report["params"] < report["params_dense"]
    assert report["execution"]["precision"] == "fp32" and report["execution"]["fast_path"]
    assert report["execution"]["cuda_graph"] == {
        "mode": "auto",
        "used": False,
        "captures": 0,
        "replays": 0,
        "failure": None,
    }
    # the downloaded model, loaded by the engine, reproduces the reported validation metrics
    manifest = client.get(f"/v1/jobs/{job_id}/checkpoints/{export['id']}/manifest").json()
    folder = workdir / "download"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(content)
    (folder / "manifest.json").write_text(json.dumps(manifest["manifest"]))
    model, _ = load_compressed(folder)
    engine_config = client.get(f"/v1/jobs/{job_id}").json()["spec"]
    measured = validation_metrics(
        model, to_engine(JobCreate.model_validate(engine_config)), workdir / "eval"
    )
    assert measured["accuracy"] == pytest.approx(report["metrics"]["accuracy"], abs=1e-9)
    assert measured["loss"] == pytest.approx(report["metrics"]["loss"], rel=1e-5)


def test_embedded_comera_up_runs_a_job_end_to_end(tmp_path):
    port = free_port()
    log = tmp_path / "up.log"
    proc = start_cli(["up", "--port", str(port)], clean_env(tmp_path / "home"), log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_for(lambda: _ready(client) or proc.poll() is not None, 120, "comera up")
            assert proc.poll() is None, log.read_text()
            key = read_key(tmp_path / "home")
            assert key in log.read_text()  # printed once, at the first start
            client.headers.update(auth_headers(key))
            _run_job_and_check(client, [log], tmp_path)
    finally:
        stop([proc], [log])
    assert (tmp_path / "home" / "comera.db").exists()


def test_distributed_api_and_worker_on_postgres_and_redis(tmp_path):
    if not postgres_available():
        pytest.skip("PostgreSQL is not reachable")
    port = free_port()
    with migrated_postgres() as db:
        env = clean_env(
            tmp_path / "home",
            COMERA_DATABASE_URL=db,
            COMERA_BROKER_URL="redis://127.0.0.1:6379/11",
            COMERA_QUEUE=f"e2e.{port}",
        )
        logs = [tmp_path / "api.log", tmp_path / "worker.log"]
        procs = [
            start_cli(["api", "--port", str(port)], env, logs[0]),
            start_cli(["worker", "--hostname", f"e2e{port}@%h"], env, logs[1]),
        ]
        try:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}", timeout=30, headers=auth_headers(make_key(env))
            ) as client:
                wait_for(lambda: _ready(client), 120, "the API")
                _run_job_and_check(client, logs, tmp_path)
        finally:
            stop(procs, logs)
