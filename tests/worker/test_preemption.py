"""Stops that leave a usable checkpoint, on both stores: SIGTERM (preemption) requeues the job
as the next attempt, which resumes from the partial checkpoint; a cancel right after a
periodic checkpoint keeps its partial checkpoint even with ``keep: 1``."""

from __future__ import annotations

import os
import signal
import time

import pytest
from sqlalchemy import update

from engine.train.callbacks import FunctionCallback
from service.store.db.models import Job, utcnow
from service.store.db.session import session_scope
from tests.worker.jobs import checkpoints, factory_for, get, make_job, settings_for, tiny_spec
from worker.artifacts import sha256_file
from worker.pipeline import run_job
from worker.problems import PROBLEM_BASE

pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)


def _first_attempt(factory, settings, job_id: str, on_event) -> str:
    """Attempt 1 of the job, ``on_event(event)`` called at every engine event."""
    return run_job(
        job_id=job_id,
        attempt=1,
        settings=settings,
        factory=factory,
        callbacks=[FunctionCallback(on_event)],
    )


def _run_preempted(factory, settings, job_id: str, step: int = 12) -> str:
    """Attempt 1, with a SIGTERM to this process at the first event of ``step`` or later,
    sent from the training loop itself (a thread polling the store could see a 35-step job
    only after it ended)."""
    sent: list[int] = []

    def terminate_at(event: dict) -> None:
        if sent or event.get("step", 0) < step:
            return
        handler = signal.getsignal(signal.SIGTERM)
        assert handler not in (signal.SIG_DFL, None), "run_job has no SIGTERM handler"
        sent.append(event["step"])
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread

    out = _first_attempt(factory, settings, job_id, terminate_at)
    assert sent, f"the job never reached step {step}"
    return out


def test_sigterm_requeues_the_job_and_the_next_attempt_resumes_from_its_checkpoint(
    db_url, tmp_path
):
    settings, factory = settings_for(tmp_path, db_url), factory_for(db_url)
    job_id = make_job(factory, tiny_spec())
    assert _run_preempted(factory, settings, job_id) == "preempted"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again

    job, (first, second) = get(factory, job_id)
    [partial] = [c for c in checkpoints(factory, job_id) if c.kind == "partial"]
    assert (job.state, job.attempt, job.lease_owner) == ("QUEUED", 2, None)
    assert job.enqueue_pending is False and job.enqueued_at is not None  # sent at once
    assert first.exit_reason == "preempted" and second.resume_from == partial.id
    assert 12 <= partial.step < 35 and partial.state == "complete"
    assert "preempted" in job.message and partial.id in job.message

    assert run_job(job_id=job_id, attempt=2, settings=settings, factory=factory) == "succeeded"
    job, (_, second) = get(factory, job_id)
    assert job.state == "SUCCEEDED" and job.progress["step"] == 35
    assert second.resume_from == partial.id and second.exit_reason == "completed"


def test_sigterm_on_the_last_attempt_fails_the_job_as_preempted(db_url, tmp_path):
    settings, factory = settings_for(tmp_path, db_url), factory_for(db_url)
    job_id = make_job(factory, tiny_spec())
    with session_scope(factory) as s:
        s.execute(update(Job).where(Job.id == job_id).values(max_attempts=1))
    assert _run_preempted(factory, settings, job_id) == "failed"
    job, [attempt] = get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == "preempted"
    assert job.error["type"] == PROBLEM_BASE + "preempted" and job.error["retryable"] is True
    assert "no attempts left" in job.error["detail"]
    assert [c.kind for c in checkpoints(factory, job_id)][-1] == "partial"


@pytest.mark.parametrize("keep", [1, 2])
def test_a_cancel_right_after_a_checkpoint_keeps_its_partial_checkpoint(db_url, tmp_path, keep):
    settings, factory = settings_for(tmp_path, db_url), factory_for(db_url)
    spec = tiny_spec(
        checkpointing={"every_n_steps": 10, "keep": keep},
        schedule=[{"kind": "early", "steps": 200_000}],
    )
    job_id = make_job(factory, spec)

    def cancel_at_first_checkpoint(event: dict) -> None:
        if event["event"] == "checkpoint" and event["step"] == 10:
            with session_scope(factory) as s:
                s.execute(update(Job).where(Job.id == job_id).values(cancel_requested_at=utcnow()))
            time.sleep(1.1)  # past the stopper's poll interval: it stops at the next boundary

    out = _first_attempt(factory, settings, job_id, cancel_at_first_checkpoint)
    job, [attempt] = get(factory, job_id)
    assert out == "cancelled", job.error
    assert job.state == "CANCELLED" and attempt.exit_reason == "cancelled"
    [partial] = [c for c in checkpoints(factory, job_id) if c.kind == "partial"]
    assert partial.step == 10 and partial.state == "complete"
    assert sha256_file(settings.artifacts / partial.path) == partial.sha256  # still there


def test_a_cancel_with_save_partial_false_leaves_no_partial_checkpoint(db_url, tmp_path):
    from service.store.db.crud.job_actions import cancel_job
    from service.store.db.crud.jobs import get_job

    settings, factory = settings_for(tmp_path, db_url), factory_for(db_url)
    spec = tiny_spec(
        checkpointing={"every_n_steps": 10, "keep": 2},
        schedule=[{"kind": "early", "steps": 200_000}],
    )
    job_id = make_job(factory, spec)

    def cancel_after_first_checkpoint(event: dict) -> None:
        if event["event"] == "checkpoint" and not event.get("partial") and event["step"] == 10:
            with session_scope(factory) as s:  # what POST /cancel {"save_partial": false} does
                outcome, _ = cancel_job(
                    session=s,
                    job=get_job(session=s, job_id=job_id),
                    mode="graceful",
                    save_partial=False,
                )
                assert outcome == "cancelling"
            time.sleep(1.1)  # past the stopper's poll interval

    out = _first_attempt(factory, settings, job_id, cancel_after_first_checkpoint)
    job, _ = get(factory, job_id)
    assert out == "cancelled" and job.state == "CANCELLED", job.error
    kinds = {c.kind: c for c in checkpoints(factory, job_id)}
    assert kinds["partial"].state == "deleted"
    latest = kinds["latest"]  # the periodic checkpoint of step 10 stays, file and all
    assert latest.state == "complete"
    assert sha256_file(settings.artifacts / latest.path) == latest.sha256
    if kinds["partial"].path != latest.path:
        assert not (settings.artifacts / kinds["partial"].path).exists()
