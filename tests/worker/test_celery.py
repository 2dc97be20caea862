"""Real Celery workers (prefork, one child per job) consuming what ``service.store.queue`` sends.

Distributed mode: PostgreSQL + Redis. Embedded mode: SQLite store + SQLite broker (kombu's
SQLAlchemy transport) under ``COMERA_HOME``, nothing else. Each test starts its own worker
on its own queue and kills it at the end.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from service.store.db.migrate import upgrade
from service.store.placement import queue_name
from service.store.queue import enqueue
from service.store.settings import Settings
from tests.helpers.groups import SERVICES
from tests.worker.jobs import factory_for, get, make_job, tiny_spec

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).parent / "celery"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)


@contextmanager
def celery_worker(
    settings: Settings, log: Path, *, devices: int = 1, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """``celery -A worker.celery_app worker`` for ``settings``, consuming the queue of jobs on
    ``devices`` (``service.store.placement``); killed (its group) on exit."""
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": str(ROOT),
        "COMERA_HOME": str(settings.home),
        "COMERA_DATABASE_URL": settings.db_url,
        "COMERA_BROKER_URL": settings.broker,
        "COMERA_QUEUE": settings.queue,
    }
    cmd = [
        str(CELERY),
        "-A",
        "worker.celery_app",
        "worker",
        "--pool",
        "prefork",
        "-c",
        "1",
        "-Q",
        queue_name(settings.queue, devices=devices),
        "-n",
        f"{settings.queue}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # warm shutdown of the parent and its child
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def wait_terminal(factory, job_id: str, log: Path, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job, attempts = get(factory, job_id)
        if job.state in TERMINAL:
            return job, attempts
        time.sleep(0.2)
    raise AssertionError(
        f"job {job_id} is still {job.state}; worker log:\n{log.read_text()[-4000:]}"
    )


def _queue() -> str:
    return f"test.{uuid.uuid4().hex[:10]}"


def purge_redis(url: str, queue: str) -> None:
    """Remove this test's queue and kombu bindings from the shared Redis."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(f"*{queue}*"):
            client.delete(key)
    finally:
        client.close()


@SERVICES
@pytest.mark.slow
def test_postgres_and_redis_worker_runs_a_job_and_enforces_its_time_limit(pg_url, tmp_path):
    broker = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
    settings = Settings(home=tmp_path, database_url=pg_url, broker_url=broker, queue=_queue())
    factory, log = factory_for(pg_url), tmp_path / "worker.log"
    quick = make_job(factory, tiny_spec())
    slow = make_job(factory, tiny_spec(schedule=[{"kind": "early", "steps": 500_000}]))
    try:
        with celery_worker(settings, log):
            assert enqueue(settings=settings, job_id=quick, attempt=1, max_wall_time_s=600)
            # 10 s: the worker stops cleanly 1 s before Celery's soft limit (0.4 s at 4 s, which
            # a loaded host could spend writing the failure, where the soft limit then lands)
            assert enqueue(settings=settings, job_id=slow, attempt=1, max_wall_time_s=10)
            job, [attempt] = wait_terminal(factory, quick, log)
            assert job.state == "SUCCEEDED", log.read_text()[-4000:]
            assert attempt.exit_reason == "completed"
            host, pid = attempt.worker.rsplit(":", 1)
            assert int(pid) != os.getpid()  # it ran in the worker's child process
            job, [attempt] = wait_terminal(factory, slow, log)
    finally:
        purge_redis(broker, settings.queue)
    assert job.state == "FAILED" and attempt.exit_reason == "timeout", log.read_text()[-4000:]
    assert job.error["type"] == "https://comera.dev/problems/timeout"


@SERVICES
@pytest.mark.slow
def test_embedded_mode_needs_nothing_but_files(tmp_path):
    settings = Settings(home=tmp_path, queue=_queue())  # SQLite store and SQLite broker
    settings.ensure_dirs()
    assert settings.db_url.startswith("sqlite:") and settings.broker.startswith("sqla+sqlite:")
    upgrade(settings.db_url)
    factory, log = factory_for(settings.db_url), tmp_path / "worker.log"
    job_id = make_job(factory, tiny_spec())
    with celery_worker(settings, log):
        assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600)
        assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600)  # dup
        job, [attempt] = wait_terminal(factory, job_id, log)
        assert job.state == "SUCCEEDED", log.read_text()[-4000:]
        deadline = time.monotonic() + 60  # the duplicate is consumed, and changes nothing
        while "'skipped'" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        version = job.version
    assert log.read_text().count(": 'skipped'") == 1, log.read_text()[-4000:]
    assert get(factory, job_id)[0].version == version
    assert (settings.artifacts / "jobs" / job_id / "attempt-1" / "export").is_dir()


def test_a_worker_refuses_a_database_without_the_schema(tmp_path):
    settings = Settings(home=tmp_path, queue=_queue())
    settings.ensure_dirs()
    log = tmp_path / "worker.log"
    with celery_worker(settings, log) as proc:
        assert proc.wait(timeout=60) != 0
    assert "run the migrations first" in log.read_text()
