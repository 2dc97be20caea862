"""Changing jobs from the API: rename/relabel, cancel, retry, delete, and the enqueue flag.

State changes go through ``transition`` (a compare-and-set that logs a ``state`` event). A
worker may move a job between our read and our write; the compare-and-set then matches
nothing, and cancellation re-reads the job and decides again. The caller commits.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from api_schemas import JobState
from service.db.crud.jobs import get_job, transition
from service.db.models import (
    Checkpoint,
    Job,
    JobAttempt,
    JobEvent,
    LatestMetric,
    MetricPoint,
    RankPoint,
    utcnow,
)

__all__ = ["cancel_job", "delete_job", "mark_enqueued", "resolve_resume", "retry_job",
           "update_job"]  # fmt: skip

S = JobState
RESUMABLE_KINDS = ("latest", "partial", "final")


def update_job(*, session: Session, job: Job, version: int, changes: dict[str, Any]) -> Job | None:
    """Set ``changes`` (name / labels) if the job is still at ``version``; None otherwise."""
    q = (update(Job).where(Job.id == job.id, Job.version == version)
         .values(**changes, version=Job.version + 1, updated_at=utcnow()))  # fmt: skip
    if session.execute(q).rowcount == 0:
        return None
    session.expire_all()
    return get_job(session=session, job_id=job.id)


def cancel_job(*, session: Session, job: Job, mode: str, save_partial: bool) -> tuple[str, Job]:
    """Cancel (service-design c.3). Returns ``(outcome, job)``; outcome is ``cancelled``
    (was QUEUED), ``cancelling`` (the worker is asked to stop), ``already_cancelling``,
    ``already_cancelled`` or ``finished`` (SUCCEEDED / FAILED: nothing to cancel)."""
    event = {"reason": "cancel requested", "mode": mode, "save_partial": save_partial}
    for _ in range(5):  # each lost race means the job moved on: decide again
        state = S(job.state)
        if state == S.QUEUED:
            moved = transition(session=session, job_id=job.id, from_states=[S.QUEUED],
                               to_state=S.CANCELLED, event=event, cancel_requested_at=utcnow(),
                               cancel_mode=mode, enqueue_pending=False,
                               message="cancelled before it started")  # fmt: skip
            if moved is not None:
                return "cancelled", moved
        elif state in (S.STARTING, S.RUNNING):
            moved = transition(session=session, job_id=job.id, from_states=[state],
                               to_state=S.CANCELLING, event=event, cancel_requested_at=utcnow(),
                               cancel_mode=mode, message=f"cancelling ({mode})")  # fmt: skip
            if moved is not None:
                return "cancelling", moved
        elif state == S.CANCELLING:
            return "already_cancelling", job
        elif state == S.CANCELLED:
            return "already_cancelled", job
        else:
            return "finished", job
        session.expire_all()
        job = get_job(session=session, job_id=job.id)  # type: ignore[assignment]
    raise RuntimeError(f"job {job.id} kept changing state while being cancelled")


def resolve_resume(*, session: Session, job: Job, choice: str) -> str:
    """``scratch``, the newest complete checkpoint (``latest_checkpoint``; ``scratch`` when
    there is none) or a given checkpoint id of this job (``ValueError`` if not usable)."""
    if choice == "scratch":
        return "scratch"
    q = select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.state == "complete",
                                 Checkpoint.kind.in_(RESUMABLE_KINDS))  # fmt: skip
    if choice == "latest_checkpoint":
        newest = session.scalars(q.order_by(Checkpoint.step.desc(),
                                            Checkpoint.created_at.desc())).first()  # fmt: skip
        return newest.id if newest is not None else "scratch"
    if session.scalars(q.where(Checkpoint.id == choice)).first() is None:
        raise ValueError(f"{choice!r} is not a complete, resumable checkpoint of this job")
    return choice


def retry_job(*, session: Session, job: Job, resume_from: str) -> Job | None:
    """FAILED / CANCELLED -> QUEUED as attempt n+1 with a new attempt row; None if the job is
    not (or no longer) retryable."""
    bumped = session.execute(
        update(Job).where(Job.id == job.id, Job.version == job.version,
                          Job.state.in_([S.FAILED.value, S.CANCELLED.value]))
        .values(attempt=Job.attempt + 1)
    ).rowcount  # fmt: skip
    if bumped == 0:
        return None
    moved = transition(session=session, job_id=job.id, from_states=[S.FAILED, S.CANCELLED],
                       to_state=S.QUEUED, version=job.version,
                       event={"reason": "retry", "resume_from": resume_from},
                       resume_from=resume_from, enqueue_pending=False, enqueued_at=None,
                       started_at=None, finished_at=None, error=None, cancel_requested_at=None,
                       cancel_mode=None, lease_owner=None, lease_expires_at=None,
                       message="queued for a retry")  # fmt: skip
    if moved is None:
        return None
    session.add(JobAttempt(job_id=job.id, attempt=moved.attempt, resume_from=resume_from))
    session.flush()
    return moved


def delete_job(*, session: Session, job: Job) -> list[str]:
    """Delete the job and every row of it; returns the artifact paths (relative) to remove."""
    paths = list(session.scalars(select(Checkpoint.path).where(Checkpoint.job_id == job.id)))
    for table in (MetricPoint, RankPoint, LatestMetric, JobEvent, Checkpoint, JobAttempt):
        session.execute(delete(table).where(table.job_id == job.id))
    session.execute(delete(Job).where(Job.id == job.id))
    session.expunge(job)
    return paths


def mark_enqueued(*, session: Session, job_id: str, sent: bool) -> None:
    """Record the outcome of sending the job's message (``enqueue_pending`` for the reaper)."""
    values: dict[str, Any] = {"enqueue_pending": not sent}
    if sent:
        values["enqueued_at"] = utcnow()
    session.execute(update(Job).where(Job.id == job_id).values(**values))
