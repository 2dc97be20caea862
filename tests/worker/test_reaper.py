"""The reaper (``service.store.reaper.reap_once``) on both stores, with a real Redis queue and real
processes to signal: lost workers, unsent and lost messages, forced cancellation."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import yaml
from sqlalchemy import select, update

from api_schemas import JobState
from service.store.db.crud.idempotency import KEEP
from service.store.db.crud.job_actions import mark_enqueued
from service.store.db.crud.pagination import as_utc
from service.store.db.models import Checkpoint, IdempotencyKey, Job, JobEvent, Tenant, utcnow
from service.store.db.session import session_scope
from service.store.queue import enqueue
from service.store.reaper import backoff_seconds, reap_once
from service.store.settings import Settings
from service.task_control import LocalControl
from tests.worker.jobs import factory_for, get, make_job, move, tiny_spec
from worker.pipeline import claim
from worker.problems import PROBLEM_BASE

S = JobState
ROOT = Path(__file__).resolve().parents[2]
OWNER = "gone-host:4242"  # a worker on another machine that stopped heartbeating


class _Unasked:
    """The remote control of the passes with no cancel due: asking it fails the test."""

    def running(self, task: str, owner: str) -> bool | None:
        raise AssertionError(f"the reaper asked whether {task} runs: no cancel was due")

    def terminate(self, task: str, owner: str, sig: str) -> bool:
        raise AssertionError(f"the reaper sent {sig} to {task}: no cancel was due")


UNASKED = _Unasked()


@pytest.fixture
def broker():
    """A private queue on the local Redis: (url, queue, client); removed afterwards."""
    db, queue = random.randint(1, 15), f"test.reap.{uuid.uuid4().hex[:8]}"
    client = redis.Redis(host="127.0.0.1", port=6379, db=db)
    yield f"redis://127.0.0.1:6379/{db}", queue, client
    for key in client.scan_iter(f"*{queue}*"):
        client.delete(key)
    client.close()


def _settings(tmp_path, db_url, broker_url="redis://127.0.0.1:1/0", queue="q", **over):
    return Settings(
        home=tmp_path,
        database_url=db_url,
        broker_url=broker_url,
        queue=queue,
        lease_seconds=5.0,
        heartbeat_seconds=1.0,
        **over,
    )


def _reap(factory, settings, now, **kw):
    """One pass of the reaper with no forced cancel due (the control must not be asked)."""
    return reap_once(factory=factory, settings=settings, control=UNASKED, now=now, **kw)


def _sent(client, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


def _running(factory, spec=None, *, owner: str = OWNER, attempt: int = 1, **values) -> str:
    """A job claimed by ``owner`` (lease 5 s from now) and RUNNING."""
    job_id = make_job(factory, spec or tiny_spec())
    if attempt > 1:
        with session_scope(factory) as s:
            s.execute(update(Job).where(Job.id == job_id).values(attempt=attempt))
    assert claim(factory, job_id=job_id, attempt=attempt, owner=owner, lease_seconds=5.0)
    progress = {"step": 12, "stage_name": "early"}
    assert move(factory, job_id, S.STARTING, S.RUNNING, progress=progress, **values)
    return job_id


def _checkpoint(factory, job_id: str, attempt: int, step: int, kind: str = "latest") -> str:
    with session_scope(factory) as s:
        job = s.get(Job, job_id)
        cid = f"ckpt_{uuid.uuid4().hex[:20]}"
        s.add(
            Checkpoint(
                id=cid,
                job_id=job_id,
                tenant_id=job.tenant_id,
                attempt=attempt,
                kind=kind,
                step=step,
                path=f"x/step-{step}.safetensors",
                size_bytes=1,
                sha256="0" * 64,
                state="complete",
                created_at=utcnow(),
            )
        )
    return cid


def _states(factory, job_id: str) -> list[tuple[str, int]]:
    with session_scope(factory) as s:
        rows = s.scalars(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.kind == "state")
            .order_by(JobEvent.seq)
        ).all()
        return [(e.data["state"], e.attempt) for e in rows]


def test_backoff_doubles_per_attempt_up_to_its_cap(tmp_path):
    settings = Settings(home=tmp_path, retry_backoff_seconds=60, retry_backoff_max_seconds=1800)
    assert [backoff_seconds(settings, n) for n in (1, 2, 3, 5, 6, 9)] == [
        60,
        120,
        240,
        960,
        1800,
        1800,
    ]


def test_a_lost_worker_requeues_its_job_after_the_backoff_from_its_newest_checkpoint(
    db_url, tmp_path, broker
):
    url, queue, client = broker
    settings = _settings(tmp_path, db_url, url, queue, retry_backoff_seconds=60)
    factory = factory_for(db_url)
    job_id = _running(factory)
    _checkpoint(factory, job_id, 1, 5)
    newest = _checkpoint(factory, job_id, 1, 10)

    early = _reap(factory, settings, utcnow() + timedelta(seconds=1))
    assert not early and get(factory, job_id)[0].state == "RUNNING"  # the lease still holds

    now = utcnow() + timedelta(seconds=10)
    report = _reap(factory, settings, now)
    assert report.requeued == [job_id] and report.sent == []  # not before the backoff
    job, (first, second) = get(factory, job_id)
    assert (job.state, job.attempt, job.enqueue_pending) == ("QUEUED", 2, True)
    assert job.lease_owner is None and job.resume_from == "latest_checkpoint"
    assert abs((as_utc(job.enqueued_at) - now).total_seconds() - 60) < 1
    assert first.exit_reason == "worker_lost" and first.ended_at is not None
    assert second.resume_from == newest and second.ended_at is None
    assert newest in job.message and "worker lost" in job.message
    assert _states(factory, job_id)[-1] == ("QUEUED", 2)
    assert _sent(client, queue) == []

    assert not _reap(factory, settings, now + timedelta(seconds=59))
    report = _reap(factory, settings, now + timedelta(seconds=61))
    assert report.sent == [job_id] and _sent(client, queue) == [f"{job_id}:2"]
    job, _ = get(factory, job_id)
    assert job.enqueue_pending is False and job.state == "QUEUED"
    assert not _reap(factory, settings, now + timedelta(seconds=62))


def test_a_lost_worker_without_attempts_left_fails_and_a_cancelling_job_is_cancelled(
    db_url, tmp_path
):
    settings, factory = _settings(tmp_path, db_url), factory_for(db_url)
    last = _running(factory, attempt=3)  # max_attempts is 3
    cancelling = _running(factory)
    assert move(factory, cancelling, S.RUNNING, S.CANCELLING, cancel_requested_at=utcnow())
    report = _reap(factory, settings, utcnow() + timedelta(seconds=10))
    assert report.failed == [last] and report.cancelled == [cancelling] and not report.requeued

    job, attempts = get(factory, last)
    assert job.state == "FAILED" and job.finished_at is not None and job.lease_owner is None
    assert job.error["type"] == PROBLEM_BASE + "worker_lost" and job.error["retryable"] is True
    assert job.error["step"] == 12 and OWNER not in job.error["detail"]  # tenants read it
    assert "no attempts are left" in job.error["detail"]
    assert attempts[-1].attempt == 3 and attempts[-1].exit_reason == "worker_lost"
    job, [attempt] = get(factory, cancelling)
    assert job.state == "CANCELLED" and attempt.exit_reason == "worker_lost"
    assert _states(factory, cancelling)[-2:] == [("CANCELLING", 1), ("CANCELLED", 1)]
    # terminal states are never touched again
    assert not _reap(factory, settings, utcnow() + timedelta(hours=1))


def test_unsent_jobs_are_sent_when_due_and_stay_pending_while_the_broker_is_down(
    db_url, tmp_path, broker
):
    url, queue, client = broker
    factory = factory_for(db_url)
    job_id = make_job(factory, tiny_spec())
    with session_scope(factory) as s:  # what the API does when the broker is down
        mark_enqueued(session=s, job_id=job_id, sent=False)
    now = utcnow()
    down = _settings(tmp_path, db_url, redrive_after_seconds=30)  # nothing listens on port 1
    t0 = time.monotonic()
    assert not _reap(factory, down, now + timedelta(seconds=31))
    assert time.monotonic() - t0 < 10 and get(factory, job_id)[0].enqueue_pending is True

    up = _settings(tmp_path, db_url, url, queue, redrive_after_seconds=30)
    assert not _reap(factory, up, now + timedelta(seconds=5))
    report = _reap(factory, up, now + timedelta(seconds=31))
    assert report.sent == [job_id] and _sent(client, queue) == [f"{job_id}:1"]
    job, _ = get(factory, job_id)
    assert job.enqueue_pending is False and job.enqueued_at is not None


def test_a_lost_message_is_sent_again_only_when_the_queue_lacks_it(db_url, tmp_path, broker):
    url, queue, client = broker
    settings = _settings(tmp_path, db_url, url, queue, redeliver_after_seconds=600)
    factory = factory_for(db_url)
    job_id = make_job(factory, tiny_spec())
    assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=60)
    with session_scope(factory) as s:
        mark_enqueued(session=s, job_id=job_id, sent=True)
    later = utcnow() + timedelta(seconds=601)
    assert not _reap(factory, settings, later)  # still in the queue
    assert not _reap(factory, settings, utcnow())  # and too young

    client.delete(queue)  # the broker lost it (a restart without persistence)
    report = _reap(factory, settings, later)
    assert report.resent == [job_id] and _sent(client, queue) == [f"{job_id}:1"]
    assert not _reap(factory, settings, later)  # stamped: not again


def test_a_lost_message_goes_again_to_the_queue_of_its_placement(db_url, tmp_path, broker):
    """A 2-device job's message is in ``QUEUE.x2``; when that queue loses it, it is sent there
    again, while a 1-device job whose message is still in ``QUEUE`` is left alone."""
    url, queue, client = broker
    settings = _settings(tmp_path, db_url, url, queue, redeliver_after_seconds=600)
    factory = factory_for(db_url)
    one = make_job(factory, tiny_spec())
    two = make_job(factory, tiny_spec(training={"batch_size": 16, "devices": 2}))
    assert enqueue(settings=settings, job_id=one, attempt=1, max_wall_time_s=60)
    assert enqueue(settings=settings, job_id=two, attempt=1, max_wall_time_s=60, devices=2)
    with session_scope(factory) as s:
        for job_id in (one, two):
            mark_enqueued(session=s, job_id=job_id, sent=True)
    assert _sent(client, queue) == [f"{one}:1"] and _sent(client, f"{queue}.x2") == [f"{two}:1"]
    later = utcnow() + timedelta(seconds=601)
    assert not _reap(factory, settings, later)

    client.delete(f"{queue}.x2")
    report = _reap(factory, settings, later)
    assert report.resent == [two] and _sent(client, f"{queue}.x2") == [f"{two}:1"]
    assert _sent(client, queue) == [f"{one}:1"]


SLEEPER = "import signal, sys, time\n{}\nprint('ready', flush=True)\ntime.sleep(120)\n"


def _sleeper(ignore_term: bool) -> subprocess.Popen:
    setup = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER.format(setup)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("ignore_term", [True, False], ids=["needs-sigkill", "stops-on-sigterm"])
def test_forced_cancellation_signals_the_lease_owner_then_cancels(db_url, tmp_path, ignore_term):
    settings = _settings(tmp_path, db_url, cancel_grace_seconds=300, cancel_kill_after_seconds=60)
    factory, control = factory_for(db_url), LocalControl(lambda: [os.getpid()])
    proc = _sleeper(ignore_term)  # "the worker's child": a child of this process
    try:
        owner = f"{socket.gethostname()}:{proc.pid}"
        job_id = _running(factory, owner=owner)
        with session_scope(factory) as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(lease_expires_at=utcnow() + timedelta(hours=1))
            )
        cancel = {"cancel_requested_at": utcnow(), "cancel_mode": "graceful"}
        assert move(factory, job_id, S.RUNNING, S.CANCELLING, **cancel)
        now = utcnow()
        assert not reap_once(factory=factory, settings=settings, now=now, control=control)
        assert proc.poll() is None  # within the grace period: left to the worker

        now += timedelta(seconds=301)
        report = reap_once(factory=factory, settings=settings, now=now, control=control)
        assert report.signalled == [(job_id, "SIGTERM")] and not report.cancelled
        if ignore_term:
            time.sleep(0.5)
            assert proc.poll() is None
            assert not reap_once(factory=factory, settings=settings, now=now, control=control)
            report = reap_once(
                factory=factory, settings=settings, control=control, now=now + timedelta(seconds=61)
            )
            assert report.signalled == [(job_id, "SIGKILL")]
            assert proc.wait(timeout=10) == -signal.SIGKILL
        else:
            assert proc.wait(timeout=10) == -signal.SIGTERM
            report = reap_once(factory=factory, settings=settings, now=now, control=control)
        assert report.cancelled == [job_id]
        job, [attempt] = get(factory, job_id)
        assert job.state == "CANCELLED" and attempt.exit_reason == "cancelled"
        assert job.message == (
            "cancelled: killed (SIGKILL)" if ignore_term else "cancelled: stopped after SIGTERM"
        )
        with session_scope(factory) as s:  # tenants read events: no host:pid in them
            data = s.scalars(select(JobEvent.data).where(JobEvent.job_id == job_id)).all()
        assert data and owner not in json.dumps(data)
    finally:
        proc.kill()
        proc.wait()


def test_an_immediate_cancel_is_forced_without_the_grace_period(db_url, tmp_path):
    settings = _settings(tmp_path, db_url, cancel_grace_seconds=300)
    factory, control = factory_for(db_url), LocalControl(lambda: [os.getpid()])
    proc = _sleeper(ignore_term=False)
    try:
        job_id = _running(factory, owner=f"{socket.gethostname()}:{proc.pid}")
        cancel = {"cancel_requested_at": utcnow(), "cancel_mode": "immediate"}
        assert move(factory, job_id, S.RUNNING, S.CANCELLING, **cancel)
        report = reap_once(factory=factory, settings=settings, control=control)
        assert report.signalled == [(job_id, "SIGTERM")]
        assert proc.wait(timeout=10) == -signal.SIGTERM
        # a process that is not ours (another parent) is never signalled
        other = LocalControl(lambda: [1])
        assert other.running("t", f"{socket.gethostname()}:{os.getpid()}") is False
        assert other.running("t", f"elsewhere:{os.getpid()}") is None
    finally:
        proc.kill()
        proc.wait()


def test_expired_idempotency_keys_are_purged_in_bounded_batches_oldest_first(db_url, tmp_path):
    settings, factory, now = _settings(tmp_path, db_url), factory_for(db_url), utcnow()
    with session_scope(factory) as s:  # 3 expired (the oldest first), 2 still kept
        s.add(Tenant(id="ten_keys", name="ten_keys"))
        s.flush()
        s.add_all(
            [
                IdempotencyKey(
                    tenant_id="ten_keys",
                    key=f"k{i}",
                    fingerprint="f",
                    state="done",
                    created_at=now - KEEP + timedelta(hours=h),
                    expires_at=now + timedelta(hours=h),
                )
                for i, h in enumerate((-3, -2, -1, 1, 2))
            ]
        )

    def keys() -> list[str]:
        with session_scope(factory) as s:
            return sorted(s.scalars(select(IdempotencyKey.key)))

    report = _reap(factory, settings, now, purge_batch=2)
    assert report.purged_keys == 2 and report and keys() == ["k2", "k3", "k4"]
    assert report.counts() == {
        "requeued": 0,
        "failed": 0,
        "cancelled": 0,
        "signalled": 0,
        "sent": 0,
        "resent": 0,
        "purged_keys": 2,
    }
    report = _reap(factory, settings, now, purge_batch=2)
    assert report.purged_keys == 1 and keys() == ["k3", "k4"]
    report = _reap(factory, settings, now, purge_batch=2)
    assert report.purged_keys == 0 and not report and keys() == ["k3", "k4"]
    later = now + timedelta(hours=1)  # expires_at == now: expired
    assert _reap(factory, settings, later).purged_keys == 1
    assert keys() == ["k4"]


@pytest.mark.slow
def test_celery_beat_runs_the_reaper_on_the_maintenance_queue(pg_url, tmp_path, broker):
    """The deployment's ``beat`` service (docker-compose.yml): a worker with embedded beat on
    the maintenance queue requeues a job whose worker was lost."""
    url, queue, client = broker
    factory = factory_for(pg_url)
    job_id = _running(factory)
    with session_scope(factory) as s:  # the lease ran out a minute ago
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(lease_expires_at=utcnow() - timedelta(minutes=1))
        )
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["beat"]
    args = compose["command"]
    args[args.index("--queues") + 1] = queue
    args[args.index("--schedule") + 1] = str(tmp_path / "beat-schedule")
    env = {
        **os.environ,
        "COMERA_HOME": str(tmp_path),
        "COMERA_DATABASE_URL": pg_url,
        "COMERA_BROKER_URL": url,
        "COMERA_MAINTENANCE_QUEUE": queue,
        "COMERA_QUEUE": f"{queue}.gpu",
        "COMERA_REAPER_INTERVAL_SECONDS": "1",
        "COMERA_RETRY_BACKOFF_SECONDS": "0",
    }
    log = tmp_path / "beat.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "celery"), *args[1:]],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while get(factory, job_id)[0].attempt == 1 and time.monotonic() < deadline:
            time.sleep(0.3)
        job, _ = get(factory, job_id)
        assert (job.state, job.attempt) == ("QUEUED", 2), log.read_text()[-4000:]
        deadline = time.monotonic() + 30  # and the next pass sends attempt 2
        while not _sent(client, f"{queue}.gpu") and time.monotonic() < deadline:
            time.sleep(0.3)
        assert _sent(client, f"{queue}.gpu") == [f"{job_id}:2"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
