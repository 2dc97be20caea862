"""A worker's hold on the attempt it claimed: the attempt row, the lease, and what it polls.

The worker (``worker.pipeline``, ``worker.lease``, ``worker.endings``) writes through these:
the claim (QUEUED -> STARTING with the lease, and the attempt row opened), the checkpoint it
resumed from, the lease extended by its heartbeat, the job's state read by its stop poll, the
``save_partial`` of the cancel that stopped it, and the requeue after a preemption. Closing
the row is :func:`service.store.db.crud.job_actions.end_attempt`. The caller commits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from api_schemas import JobState
from service.store.db.crud.job_actions import requeue_job
from service.store.db.crud.jobs import transition
from service.store.db.models import Job, JobAttempt, JobEvent, utcnow

__all__ = [
    "ACTIVE_STATES",
    "CANCEL_SCAN",
    "StopState",
    "cancel_saves_partial",
    "claim_attempt",
    "extend_lease",
    "open_attempt",
    "requeue_preempted",
    "set_resume_from",
    "stop_state",
]

ACTIVE_STATES = (JobState.STARTING.value, JobState.RUNNING.value, JobState.CANCELLING.value)
CANCEL_SCAN = 50  # recent events of a job searched for its latest cancel request

StopState = tuple[str, datetime | None, str | None]  # (state, cancel_requested_at, lease_owner)


def claim_attempt(
    *, session: Session, job_id: str, attempt: int, owner: str, lease_seconds: float
) -> Job | None:
    """QUEUED -> STARTING for exactly ``attempt``, with ``owner``'s lease for
    ``lease_seconds`` (``started_at`` kept from an earlier attempt), and the attempt row opened
    (:func:`open_attempt`); None when the job is not QUEUED on that attempt."""
    now = utcnow()
    job = transition(
        session=session,
        job_id=job_id,
        from_states=[JobState.QUEUED],
        to_state=JobState.STARTING,
        attempt=attempt,
        lease_owner=owner,
        lease_expires_at=now + timedelta(seconds=lease_seconds),
        started_at=func.coalesce(Job.started_at, now),
        finished_at=None,
        error=None,
        enqueue_pending=False,
        message="preparing data and model",
    )
    if job is None:
        return None
    open_attempt(
        session=session,
        job_id=job_id,
        tenant_id=job.tenant_id,
        attempt=attempt,
        worker=owner,
        now=now,
    )
    return job


def open_attempt(
    *, session: Session, job_id: str, tenant_id: str, attempt: int, worker: str, now: datetime
) -> None:
    """The row of ``attempt`` as started by ``worker`` at ``now`` (its end cleared): the row
    a requeue created, updated, or a new one."""
    q = (
        update(JobAttempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
        .values(worker=worker, started_at=now, ended_at=None, exit_reason=None)
    )
    if session.execute(q).rowcount == 0:
        session.add(
            JobAttempt(
                job_id=job_id,
                tenant_id=tenant_id,
                attempt=attempt,
                worker=worker,
                started_at=now,
            )
        )


def set_resume_from(*, session: Session, job_id: str, attempt: int, checkpoint_id: str) -> None:
    """Record on the attempt row the checkpoint it resumed from."""
    session.execute(
        update(JobAttempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
        .values(resume_from=checkpoint_id)
    )


def extend_lease(*, session: Session, job_id: str, owner: str, lease_seconds: float) -> bool:
    """Push the lease to now + ``lease_seconds`` if it is still ``owner``'s and the job is
    active; False if it is not."""
    q = (
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == owner, Job.state.in_(ACTIVE_STATES))
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds))
    )
    return session.execute(q).rowcount == 1


def stop_state(*, session: Session, job_id: str) -> StopState | None:
    """``(state, cancel_requested_at, lease_owner)`` of the job; None if it was deleted."""
    row = session.execute(
        select(Job.state, Job.cancel_requested_at, Job.lease_owner).where(Job.id == job_id)
    ).first()
    return None if row is None else (row[0], row[1], row[2])


def cancel_saves_partial(*, session: Session, job_id: str, tenant_id: str) -> bool:
    """The ``save_partial`` of the job's latest cancel request among its :data:`CANCEL_SCAN`
    newest events (default true)."""
    rows = session.scalars(
        select(JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.tenant_id == tenant_id)
        .order_by(JobEvent.seq.desc())
        .limit(CANCEL_SCAN)
    )
    for data in rows:
        if isinstance(data, dict) and data.get("reason") == "cancel requested":
            return bool(data.get("save_partial", True))
    return True


def requeue_preempted(*, session: Session, job: Job, owner: str) -> Job | None:
    """A preempted attempt (STARTING or RUNNING, still ``owner``'s lease) back to QUEUED as
    attempt n+1, its message due now (:func:`service.store.db.crud.job_actions.requeue_job`);
    None when it moved on."""
    return requeue_job(
        session=session,
        job=job,
        from_states=[JobState.STARTING, JobState.RUNNING],
        reason="preempted",
        send_at=utcnow(),
        where=[Job.lease_owner == owner],
    )
