"""Tenants take turns (docs/service.md#scheduling-order): the store's order on both backends,
and one real Celery worker (PostgreSQL + Redis, and the embedded SQLite store and broker)
starting tenant B's only job second, not after tenant A's three earlier ones."""

from __future__ import annotations

import os
import random
import signal
import uuid

import pytest
from sqlalchemy import select, update

from api_schemas import JobState
from service.store.db.crud.fair_queue import next_tenant, tenant_order
from service.store.db.crud.jobs import transition
from service.store.db.migrate import upgrade
from service.store.db.models import Job, JobAttempt
from service.store.db.session import session_scope
from service.store.queue import enqueue
from service.store.settings import Settings
from tests.helpers.groups import SERVICES
from tests.helpers.services import wait_for
from tests.worker.jobs import factory_for, get, make_job, tiny_spec
from tests.worker.test_celery import celery_worker, purge_redis
from worker.pipeline import claim

S = JobState
A, B = "ten_a", "ten_b"
pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)


def _order(factory) -> list[str]:
    with session_scope(factory) as s:
        return [t.tenant_id for t in tenant_order(session=s)]


def _its_turn(factory, job_id: str) -> bool:
    with session_scope(factory) as s:
        return next_tenant(session=s, job_id=job_id, attempt=1).its_turn


def _start(factory, job_id: str) -> None:
    assert claim(factory, job_id=job_id, attempt=1, owner="host:1", lease_seconds=60)


def _finish(factory, job_id: str) -> None:
    with session_scope(factory) as s:
        assert transition(session=s, job_id=job_id, from_states=[S.STARTING], to_state=S.FAILED)


def test_the_turn_goes_to_the_tenant_with_the_least_running_then_the_least_recent(db_url):
    factory = factory_for(db_url)
    a1, a2 = make_job(factory, tiny_spec(), tenant=A), make_job(factory, tiny_spec(), tenant=A)
    b1 = make_job(factory, tiny_spec(), tenant=B)
    unsent = make_job(factory, tiny_spec(), tenant="ten_c")  # its message is not out yet
    pair = make_job(factory, tiny_spec(training={"devices": 2}), tenant="ten_d")  # gpu.any.x2
    with session_scope(factory) as s:
        s.execute(update(Job).where(Job.id == unsent).values(enqueue_pending=True))
        assert [t.tenant_id for t in tenant_order(session=s, devices=2)] == ["ten_d"]
        # the message in hand counts its own job as waiting, even before it is marked sent
        assert next_tenant(session=s, job_id=unsent, attempt=1).waiting == 4
        assert next_tenant(session=s, job_id=pair, attempt=1).its_turn
    assert _order(factory) == [A, B]  # nothing runs, nobody started: the oldest job first
    assert _its_turn(factory, a1) and _its_turn(factory, a2) and not _its_turn(factory, b1)

    _start(factory, a1)  # A has one running: B's turn
    assert _order(factory) == [B, A]
    assert _its_turn(factory, b1) and not _its_turn(factory, a2)
    _finish(factory, a1)  # nothing runs again, but A started last: still B's turn
    assert _order(factory) == [B, A]

    _start(factory, b1)
    _finish(factory, b1)  # B started last now, and has nothing waiting
    assert _order(factory) == [A]
    assert _its_turn(factory, a2)
    with session_scope(factory) as s:  # a job no longer waiting is nobody's to hold back
        decision = next_tenant(session=s, job_id=b1, attempt=1)
    assert decision.turn is None and decision.its_turn


def _started_at(factory, job_id: str):
    with session_scope(factory) as s:
        return s.scalar(
            select(JobAttempt.started_at).where(
                JobAttempt.job_id == job_id, JobAttempt.attempt == 1
            )
        )


@pytest.mark.slow
@SERVICES
@pytest.mark.parametrize("mode", ["distributed", "embedded"])
def test_one_worker_starts_the_other_tenants_job_second(mode, request, tmp_path):
    """Distributed: PostgreSQL + Redis. Embedded: SQLite store and SQLite broker, whose worker
    prefetches the next message while a job runs."""
    queue = f"test.{uuid.uuid4().hex[:10]}"
    if mode == "distributed":
        broker = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
        db = request.getfixturevalue("pg_url")
        settings = Settings(home=tmp_path, database_url=db, broker_url=broker, queue=queue)
    else:
        settings = Settings(home=tmp_path, queue=queue)
        settings.ensure_dirs()
        upgrade(settings.db_url)
    factory, log = factory_for(settings.db_url), tmp_path / "worker.log"
    spec = tiny_spec(schedule=[{"kind": "early", "steps": 5}])
    first = [make_job(factory, spec, tenant=A) for _ in range(3)]
    second = make_job(factory, spec, tenant=B)
    for job_id in [*first, second]:  # sent first in, first out: A, A, A, then B
        assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600)
    logs = lambda: log.read_text()[-4000:]  # noqa: E731
    try:
        with celery_worker(settings, log) as proc:
            # the wait covers the worker's start too, which took ~20 s on a loaded host; a
            # passing run ends as soon as B's job starts
            wait_for(lambda: _started_at(factory, second), 120, "B's job to start", logs)
            starts = {j: _started_at(factory, j) for j in [*first, second]}
            states = {j: get(factory, j)[0].state for j in [*first, second]}
            os.killpg(proc.pid, signal.SIGKILL)  # what it does next is not this test's
            proc.wait(timeout=10)
    finally:
        if mode == "distributed":
            purge_redis(settings.broker, queue)
    assert starts[first[0]] is not None and starts[first[0]] < starts[second], logs()
    # B's job started second: A's second and third had not started when it did
    assert [starts[j] for j in first[1:]] == [None, None], (starts, logs())
    assert [states[j] for j in first[1:]] == ["QUEUED", "QUEUED"]
    assert "'deferred'" in log.read_text()  # A's messages went back behind B's
