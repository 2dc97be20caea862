"""What the reaper reads (``service.store.reaper``): jobs whose lease expired, cancels past
their grace, QUEUED jobs to send or send again, its own SIGTERM to an attempt, and the jobs
waiting for each placement.

The lists of jobs are detached from the session (``expunge_all``) so the reaper can act on
each in a transaction of its own. The caller commits.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from api_schemas import JobState
from service.store.db.crud.attempts import ACTIVE_STATES
from service.store.db.crud.pagination import as_utc
from service.store.db.models import Job, JobEvent

__all__ = [
    "SIGNAL_SCAN",
    "cancels_due",
    "expired_job_ids",
    "queued_sent_before",
    "queued_unsent",
    "sigterm_sent_at",
    "waiting_by_placement",
]

SIGNAL_SCAN = 50  # recent log events of an attempt searched for the reaper's own SIGTERM


def expired_job_ids(*, session: Session, now: datetime) -> list[str]:
    """STARTING, RUNNING or CANCELLING jobs whose lease expired before ``now``."""
    q = select(Job).where(Job.state.in_(ACTIVE_STATES), Job.lease_expires_at < now)
    return [j.id for j in session.scalars(q)]


def cancels_due(*, session: Session, now: datetime, grace: datetime) -> list[Job]:
    """CANCELLING jobs still leased at ``now`` whose cancel is ``immediate`` or was requested
    at ``grace`` or before (detached)."""
    q = select(Job).where(
        Job.state == JobState.CANCELLING.value,
        Job.lease_expires_at >= now,
        or_(Job.cancel_mode == "immediate", Job.cancel_requested_at <= grace),
    )
    jobs = list(session.scalars(q))
    session.expunge_all()
    return jobs


def _queued(session: Session, *conditions: ColumnElement[bool]) -> list[Job]:
    q = select(Job).where(Job.state == JobState.QUEUED.value, *conditions)
    jobs = list(session.scalars(q.order_by(Job.created_at)))
    session.expunge_all()
    return jobs


def queued_unsent(*, session: Session, now: datetime, flagged: datetime) -> list[Job]:
    """QUEUED jobs flagged ``enqueue_pending`` that are due, oldest first (detached): a requeue
    whose ``enqueued_at`` is past, or a failed submission flagged at ``flagged`` or before (no
    ``enqueued_at``, ``updated_at`` then)."""
    due_at = or_(Job.enqueued_at <= now, Job.enqueued_at.is_(None) & (Job.updated_at <= flagged))
    return _queued(session, Job.enqueue_pending.is_(True), due_at)


def queued_sent_before(*, session: Session, before: datetime) -> list[Job]:
    """QUEUED jobs whose message went out at ``before`` or earlier, oldest first (detached)."""
    return _queued(session, Job.enqueue_pending.is_(False), Job.enqueued_at <= before)


def sigterm_sent_at(*, session: Session, job: Job) -> datetime | None:
    """When the reaper's SIGTERM to the job's current attempt was logged (among the attempt's
    :data:`SIGNAL_SCAN` newest ``log`` events), if it was."""
    q = (
        select(JobEvent)
        .where(
            JobEvent.job_id == job.id,
            JobEvent.tenant_id == job.tenant_id,
            JobEvent.attempt == job.attempt,
            JobEvent.kind == "log",
        )
        .order_by(JobEvent.seq.desc())
        .limit(SIGNAL_SCAN)
    )
    for e in session.scalars(q):
        if (e.data or {}).get("signal") == "SIGTERM":
            return as_utc(e.t)
    return None


def waiting_by_placement(*, session: Session) -> list[tuple[int | None, int | None, int]]:
    """``(devices, nodes, count)`` of the QUEUED jobs with a message sent, by the spec's
    ``training.devices`` and ``training.nodes`` (None where the spec has none)."""
    training = Job.spec["training"]
    devices, nodes = training["devices"].as_integer(), training["nodes"].as_integer()
    rows = session.execute(
        select(devices, nodes, func.count())
        .where(Job.state == JobState.QUEUED.value, Job.enqueue_pending.is_(False))
        .group_by(devices, nodes)
    )
    return [(d, n, int(count)) for d, n, count in rows]
