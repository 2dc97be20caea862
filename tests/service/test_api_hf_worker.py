"""An ``hf`` job submitted over HTTP and run by a real Celery worker: a tiny LLaMA directory
under the data root or uploaded (``POST /v1/models``), compressed; ``model/hf/`` downloaded as
its checkpoint (a tar) and loaded by transformers in a process where importing this project
fails, its outputs those of the compressed checkpoint."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from service.store.db.models import Checkpoint
from service.store.queue import enqueue
from service.store.settings import Settings
from tests.engine.train.test_hf_jobs import LOADER, _reference
from tests.helpers.services import wait_for
from tests.service.api_helpers import Api
from tests.service.test_api_hf_jobs import hf_body, hf_data_root
from tests.service.test_api_models import tar_of, upload
from tests.worker.test_celery import celery_worker

# A real worker boots torch and transformers, the job exports two directories and a fresh
# Python loads them (about 20 s alone): beside the suite's other worker tests on two cores
# it came within reach of the 60 s limit, so these run among the 'solo' tests
pytestmark = [
    pytest.mark.slow,
    pytest.mark.solo,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
]


@contextmanager
def real_worker(api: Api, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
    """A real Celery worker on the API's store and data root (the embedded broker), started
    now (it boots while the test writes its files); yields ``run(body)``: submit ``body``,
    send it to the worker, return the job once it is terminal."""
    settings = Settings(
        home=api.settings.home, database_url=api.settings.db_url, queue=f"t.{uuid.uuid4().hex[:8]}"
    )
    log = tmp_path / "worker.log"

    def run(body: dict[str, Any]) -> dict[str, Any]:
        resp = api.client.post("/v1/jobs", json=body)
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
        assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600)

        def done() -> dict[str, Any] | None:
            job = api.client.get(f"/v1/jobs/{job_id}").json()
            return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

        # well inside the test's 60 s, so that a stall shows the worker's log
        job = wait_for(done, 40, "the hf job", lambda: log.read_text()[-4000:])
        assert job["state"] == "SUCCEEDED", f"{job.get('error')}\n{log.read_text()[-4000:]}"
        return job

    with celery_worker(settings, log):
        yield run


def download_dirs(api: Api, job_id: str, into: Path) -> dict[str, Path]:
    """Every ``hf`` / ``dense`` checkpoint of the job, downloaded and unpacked under ``into``."""
    items = api.client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    out = {}
    for c in items:
        if c["kind"] not in ("hf", "dense"):
            continue
        assert c["format"] == "tar" and c["state"] == "complete"
        resp = api.client.get(f"/v1/jobs/{job_id}/checkpoints/{c['id']}/content")
        assert resp.status_code == 200 and c["sha256"] in resp.headers["etag"]
        with tarfile.open(fileobj=io.BytesIO(resp.content)) as tar:
            tar.extractall(into, filter="data")
        out[c["kind"]] = into / c["kind"]
    return out


def clean_load(requests: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    """The outputs of each request's directory loaded by transformers alone (no project)."""
    (tmp_path / "requests.json").write_text(json.dumps(requests))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    load = subprocess.run(
        [sys.executable, "-I", str(LOADER), str(tmp_path / "requests.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    return json.loads(load.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("source", ["hf_dir", "uploaded"])
def test_an_hf_job_runs_on_a_real_worker_and_its_hf_directory_loads_alone(
    api: Api, tmp_path, source: str
):
    sqlite = api.settings.db_url.startswith("sqlite")
    if sqlite != (source == "hf_dir"):  # the stores' upload paths: tests/service/test_api_models
        pytest.skip("each source once: the data-root directory on SQLite, an upload on PostgreSQL")
    body = hf_body()
    body["schedule"] = [{"kind": "early", "steps": 4}]  # TT-SVD at full rank, then training
    with real_worker(api, tmp_path) as run:
        root = hf_data_root(Path(api.settings.data))
        if source == "uploaded":
            resp = upload(api, tar_of(root / "models" / "llama"))
            assert resp.status_code == 201, resp.text
            body["model"]["source"] = {"kind": "uploaded", "id": resp.json()["id"]}
        job = run(body)
    dirs = download_dirs(api, job["id"], tmp_path / "download")
    assert set(dirs) == {"hf", "dense"}
    assert {"config.json", "model.safetensors", "modeling_comera_tt.py", "tokenizer.json"} <= {
        p.name for p in dirs["hf"].iterdir()
    }
    items = api.client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    [export] = [c for c in items if c["kind"] == "export"]
    with api.sessions() as s:
        export_dir = Path(api.settings.artifacts, s.get(Checkpoint, export["id"]).path).parent
    ref = _reference(export_dir, seed=0)  # the compressed checkpoint's outputs
    auto = "AutoModelForCausalLM"
    results = clean_load(
        [{"dir": str(dirs[k]), "auto": auto, **ref} for k in ("hf", "dense")], tmp_path
    )
    assert [r["class"] for r in results] == ["ComeraTTModel", "LlamaForCausalLM"]
    for r in results:
        assert r["max_abs_diff"] < 1e-5 and r["generated"] == 5, r
    # the deployment table the worker measured reaches the API's report
    deploy = api.client.get(f"/v1/jobs/{job['id']}/report").json()["deploy"]
    assert deploy["original"]["kind"] == "pretrained"
    assert deploy["exported"]["parameters"] < deploy["original"]["parameters"]
