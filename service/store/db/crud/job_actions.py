"""Changing jobs: rename/relabel, cancel, retry, delete, the enqueue flag, and the recovery
of a lost attempt (the reaper's and a preempted worker's requeue).

State changes go through ``transition`` (a compare-and-set that logs a ``state`` event). A
worker may move a job between our read and our write; the compare-and-set then matches
nothing, and cancellation re-reads the job and decides again. The caller commits.

``enqueued_at`` of a QUEUED job says when its message went out; while ``enqueue_pending`` is
set it is the time the reaper may send it (a requeue's backoff), or None when sending failed
at submission (the reaper re-sends it ``redrive_after_seconds`` after ``updated_at``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, select, update
from sqlalchemy.orm import Session

from api_schemas import JobState
from service.store.db.crud.jobs import get_job, transition
from service.store.db.models import (
    Checkpoint,
    Job,
    JobAttempt,
    JobEvent,
    LatestMetric,
    MetricPoint,
    RankPoint,
    utcnow,
)

__all__ = [
    "cancel_job",
    "delete_job",
    "end_attempt",
    "mark_enqueued",
    "mark_sent",
    "requeue_job",
    "resolve_resume",
    "retry_job",
    "update_job",
]

S = JobState
RESUMABLE_KINDS = ("latest", "partial", "final")


def update_job(*, session: Session, job: Job, version: int, changes: dict[str, Any]) -> Job | None:
    """Set ``changes`` (name / labels) if the job is still at ``version``; None otherwise."""
    q = (
        update(Job)
        .where(Job.id == job.id, Job.version == version)
        .values(**changes, version=Job.version + 1, updated_at=utcnow())
    )
    if session.execute(q).rowcount == 0:
        return None
    session.expire_all()
    return get_job(session=session, job_id=job.id)


def cancel_job(*, session: Session, job: Job, mode: str, save_partial: bool) -> tuple[str, Job]:
    """Cancel (docs/service.md#cancellation). Returns ``(outcome, job)``; outcome is ``cancelled``
    (was QUEUED), ``cancelling`` (the worker is asked to stop), ``already_cancelling``,
    ``already_cancelled`` or ``finished`` (SUCCEEDED / FAILED: nothing to cancel)."""
    event = {"reason": "cancel requested", "mode": mode, "save_partial": save_partial}
    for _ in range(5):  # each lost race means the job moved on: decide again
        state = S(job.state)
        if state == S.QUEUED:
            moved = transition(
                session=session,
                job_id=job.id,
                from_states=[S.QUEUED],
                to_state=S.CANCELLED,
                event=event,
                cancel_requested_at=utcnow(),
                cancel_mode=mode,
                enqueue_pending=False,
                message="cancelled before it started",
            )
            if moved is not None:
                return "cancelled", moved
        elif state in (S.STARTING, S.RUNNING):
            moved = transition(
                session=session,
                job_id=job.id,
                from_states=[state],
                to_state=S.CANCELLING,
                event=event,
                cancel_requested_at=utcnow(),
                cancel_mode=mode,
                message=f"cancelling ({mode})",
            )
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
    q = select(Checkpoint).where(
        Checkpoint.job_id == job.id,
        Checkpoint.tenant_id == job.tenant_id,
        Checkpoint.state == "complete",
        Checkpoint.kind.in_(RESUMABLE_KINDS),
    )
    if choice == "latest_checkpoint":
        newest = session.scalars(
            q.order_by(Checkpoint.step.desc(), Checkpoint.created_at.desc())
        ).first()
        return newest.id if newest is not None else "scratch"
    if session.scalars(q.where(Checkpoint.id == choice)).first() is None:
        raise ValueError(f"{choice!r} is not a complete, resumable checkpoint of this job")
    return choice


def retry_job(*, session: Session, job: Job, resume_from: str) -> Job | None:
    """FAILED / CANCELLED -> QUEUED as attempt n+1 with a new attempt row; None if the job is
    not (or no longer) retryable."""
    bumped = session.execute(
        update(Job)
        .where(
            Job.id == job.id,
            Job.version == job.version,
            Job.state.in_([S.FAILED.value, S.CANCELLED.value]),
        )
        .values(attempt=Job.attempt + 1)
    ).rowcount
    if bumped == 0:
        return None
    moved = transition(
        session=session,
        job_id=job.id,
        from_states=[S.FAILED, S.CANCELLED],
        to_state=S.QUEUED,
        version=job.version,
        event={"reason": "retry", "resume_from": resume_from},
        resume_from=resume_from,
        enqueue_pending=False,
        enqueued_at=None,
        started_at=None,
        finished_at=None,
        error=None,
        cancel_requested_at=None,
        cancel_mode=None,
        lease_owner=None,
        lease_expires_at=None,
        message="queued for a retry",
    )
    if moved is None:
        return None
    session.add(
        JobAttempt(
            job_id=job.id, tenant_id=moved.tenant_id, attempt=moved.attempt, resume_from=resume_from
        )
    )
    session.flush()
    return moved


def delete_job(*, session: Session, job: Job) -> list[str]:
    """Delete the job and every row of it; returns the artifact paths (relative) to remove."""
    paths = list(
        session.scalars(
            select(Checkpoint.path).where(
                Checkpoint.job_id == job.id, Checkpoint.tenant_id == job.tenant_id
            )
        )
    )
    for table in (MetricPoint, RankPoint, LatestMetric, JobEvent, Checkpoint, JobAttempt):
        session.execute(
            delete(table).where(table.job_id == job.id, table.tenant_id == job.tenant_id)
        )
    session.execute(delete(Job).where(Job.id == job.id))
    session.expunge(job)
    return paths


def mark_enqueued(*, session: Session, job_id: str, sent: bool) -> None:
    """Record the outcome of sending the job's message (``enqueue_pending`` for the reaper)."""
    values: dict[str, Any] = {"enqueue_pending": not sent}
    if sent:
        values["enqueued_at"] = utcnow()
    session.execute(update(Job).where(Job.id == job_id).values(**values))


def mark_sent(*, session: Session, job_id: str, attempt: int, now: datetime) -> bool:
    """After the reaper sent attempt ``attempt``: clear ``enqueue_pending`` and stamp
    ``enqueued_at``, if the job still waits on that attempt; False if it moved on."""
    q = (
        update(Job)
        .where(Job.id == job_id, Job.state == S.QUEUED.value, Job.attempt == attempt)
        .values(enqueue_pending=False, enqueued_at=now)
    )
    return session.execute(q).rowcount == 1


def end_attempt(*, session: Session, job_id: str, attempt: int, reason: str) -> None:
    """Set ``ended_at`` and ``exit_reason`` of the attempt row unless it is already closed."""
    session.execute(
        update(JobAttempt)
        .where(
            JobAttempt.job_id == job_id,
            JobAttempt.attempt == attempt,
            JobAttempt.ended_at.is_(None),
        )
        .values(ended_at=utcnow(), exit_reason=reason)
    )


def requeue_job(
    *,
    session: Session,
    job: Job,
    from_states: Iterable[JobState],
    reason: str,
    send_at: datetime,
    where: Iterable[ColumnElement[bool]] = (),
    version: int | None = None,
    message: str = "",
) -> Job | None:
    """A lost or preempted attempt n -> QUEUED as attempt n+1 (one compare-and-set on the
    state, ``job.attempt``, ``version`` and ``where``), with a new attempt row. It resumes
    from the newest complete checkpoint when attempt n wrote one (else as attempt n was
    told), and its message goes out at ``send_at`` (``enqueue_pending``: the reaper sends it,
    or the caller does and calls :func:`mark_sent`). Attempt n is closed as ``reason``."""
    job_id, n, tenant_id = job.id, job.attempt, job.tenant_id  # ``job`` expires below
    q = select(Checkpoint).where(
        Checkpoint.job_id == job_id,
        Checkpoint.tenant_id == tenant_id,
        Checkpoint.attempt == n,
        Checkpoint.state == "complete",
        Checkpoint.kind.in_(("latest", "partial")),
    )
    ckpt = session.scalars(q.order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc())).first()
    resume = "latest_checkpoint" if ckpt is not None else job.resume_from
    where_from = (
        f"checkpoint {ckpt.id} (step {ckpt.step})"
        if ckpt is not None
        else "the start"
        if resume == "scratch"
        else "the newest complete checkpoint, if any"
        if resume in (None, "latest_checkpoint")
        else resume
    )
    text = message or (
        f"{reason.replace('_', ' ')}: attempt {n + 1} of "
        f"{job.max_attempts} queued, resuming from {where_from}"
    )
    moved = transition(
        session=session,
        job_id=job_id,
        from_states=from_states,
        to_state=S.QUEUED,
        version=version,
        attempt=n,
        where=where,
        next_attempt=True,
        event={
            "reason": reason,
            "resume_from": ckpt.id if ckpt else resume,
            "send_at": send_at.isoformat(),
        },
        resume_from=resume,
        enqueue_pending=True,
        enqueued_at=send_at,
        lease_owner=None,
        lease_expires_at=None,
        error=None,
        message=text,
    )
    if moved is None:
        return None
    end_attempt(session=session, job_id=job_id, attempt=n, reason=reason)
    session.add(
        JobAttempt(
            job_id=job_id,
            tenant_id=tenant_id,
            attempt=moved.attempt,
            resume_from=ckpt.id if ckpt is not None else resume,
        )
    )
    session.flush()
    return moved
