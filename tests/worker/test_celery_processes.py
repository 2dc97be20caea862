"""Data-parallel jobs through a real Celery worker (``comera worker --devices 2``'s queue): the
task starts ``torchrun`` with 2 gloo processes of 1 thread each and follows them.

A job to SUCCEEDED on PostgreSQL and Redis, its export downloaded through the API; a cancel of
a running job in embedded mode (SQLite store and broker) ends both training processes (their
pids gone) and the job as CANCELLED with a partial checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from service.store.db.crud.job_actions import cancel_job
from service.store.db.crud.jobs import get_job
from service.store.db.migrate import upgrade
from service.store.db.session import session_scope
from service.store.queue import enqueue
from service.store.settings import Settings
from tests.helpers.groups import LAUNCHES
from tests.service.api_helpers import issue_key
from tests.worker import jobs
from tests.worker.test_celery import _queue, celery_worker, purge_redis, wait_terminal
from worker.processes import _start_time

pytestmark = [
    pytest.mark.slow,
    LAUNCHES,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
]
TWO = {"batch_size": 16, "log_every": 5, "devices": 2}
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def _training_processes(out: Path) -> dict[int, int]:
    """``{pid: start time}`` of the processes training in ``out``: ``torchrun`` and its ranks."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine.train" in argv and str(out).encode() in argv:
            start = _start_time(int(entry.name))
            if start is not None:
                found[int(entry.name)] = start
    return found


def _ranks(found: dict[int, int]) -> list[int]:
    """The ranks among ``found``: the processes that are not the launcher."""
    ranks = []
    for pid in found:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"torch.distributed.run" not in argv:
            ranks.append(pid)
    return ranks


def test_a_two_device_job_runs_through_a_worker_and_its_export_downloads(pg_url, tmp_path):
    broker = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
    settings = Settings(home=tmp_path, database_url=pg_url, broker_url=broker, queue=_queue())
    factory, log = jobs.factory_for(pg_url), tmp_path / "worker.log"
    job_id = jobs.make_job(factory, jobs.tiny_spec(training=TWO))
    try:
        with celery_worker(settings, log, devices=2, env=ONE_THREAD):
            assert enqueue(
                settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600, devices=2
            )
            job, [attempt] = wait_terminal(factory, job_id, log, timeout=180)
    finally:
        purge_redis(broker, settings.queue)  # also QUEUE.x2
    assert job.state == "SUCCEEDED", (job.error, log.read_text()[-4000:])
    assert attempt.exit_reason == "completed" and int(attempt.worker.rsplit(":")[1]) != os.getpid()
    assert max(jobs.metric_series(factory, job_id)["loss"]) == 35
    assert jobs.rank_series(factory, job_id)
    assert {c.kind for c in jobs.checkpoints(factory, job_id)} >= {"latest", "export"}

    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {issue_key(app, tenant=jobs.TENANT)}"
        items = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
        export = next(c for c in items if c["kind"] == "export")
        content = client.get(f"/v1/jobs/{job_id}/checkpoints/{export['id']}/content")
        assert content.status_code == 200
        assert hashlib.sha256(content.content).hexdigest() == export["sha256"]
        report = client.get(f"/v1/jobs/{job_id}/report").json()
    assert report["file_bytes"] == len(content.content) and report["file_ratio"] > 1
    distributed = report["execution"]["distributed"]
    assert distributed["world_size"] == 2 and distributed["backend"] == "gloo"
    assert distributed["ddp_rebuilds"] >= 1 and distributed["ddp_rebuild_seconds"] >= 0


# a worker, torchrun and two ranks: 17 s alone, 21-31 s beside two other test processes on 2
# cores; so it runs alone (scripts/test.sh)
@pytest.mark.solo
def test_cancel_of_a_running_two_device_job_ends_both_processes(tmp_path):
    settings = Settings(home=tmp_path, queue=_queue())  # SQLite store and SQLite broker
    settings.ensure_dirs()
    upgrade(settings.db_url)
    factory, log = jobs.factory_for(settings.db_url), tmp_path / "worker.log"
    spec = jobs.tiny_spec(training=TWO, schedule=[{"kind": "early", "steps": 100_000}])
    job_id = jobs.make_job(factory, spec)
    out = settings.artifacts / "jobs" / job_id / "attempt-1"
    with celery_worker(settings, log, devices=2, env=ONE_THREAD):
        assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600, devices=2)
        deadline, found = time.monotonic() + 120, {}
        while time.monotonic() < deadline:  # both ranks training
            job, _ = jobs.get(factory, job_id)
            found = _training_processes(out)
            if job.state == "RUNNING" and job.progress.get("step", 0) >= 3:
                break
            assert job.state in ("QUEUED", "STARTING", "RUNNING"), job.error
            time.sleep(0.2)
        assert len(_ranks(found)) == 2, (found, log.read_text()[-4000:])
        with session_scope(factory) as s:
            outcome, _ = cancel_job(
                session=s, job=get_job(session=s, job_id=job_id), mode="graceful", save_partial=True
            )
        assert outcome == "cancelling"
        job, [attempt] = wait_terminal(factory, job_id, log, timeout=120)
    assert job.state == "CANCELLED" and attempt.exit_reason == "cancelled", log.read_text()[-4000:]
    alive = [pid for pid, start in found.items() if _start_time(pid) == start]
    assert alive == [] and _training_processes(out) == {}
    [partial] = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "partial"]
    assert partial.id in job.message and partial.step >= 3
