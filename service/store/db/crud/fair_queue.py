"""Whose turn it is: the fair order between tenants of the jobs waiting in one placement queue
(docs/service.md#scheduling-order).

The broker's queue is first in, first out; this order is not. Among the tenants with a job
waiting in a placement's queue (``service.store.placement``), the next turn goes to the tenant

1. with the fewest jobs running (STARTING, RUNNING or CANCELLING, on any queue), then
2. whose latest attempt started longest ago (a tenant that never ran a job first), then
3. whose oldest waiting job is oldest.

A job *waits* when it is QUEUED with its message out (``enqueue_pending`` unset); a job whose
message is not out yet (a requeue in its backoff, a failed send) is no one's turn until the
reaper sends it. The worker asks :func:`next_tenant` for the job of each message it takes
(``worker.tasks``) and runs it only when it is its tenant's turn; otherwise the message goes
back to the end of the queue, so the turn's own message (with its own time limits and task
id) gets there first. Only reads: the claim's compare-and-set still decides who runs a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from api_schemas import JobState
from service.store.db.crud.pagination import as_utc
from service.store.db.models import Job, JobAttempt
from service.store.placement import placement

__all__ = [
    "ACTIVE",
    "DEFAULT_WALL_TIME_S",
    "Decision",
    "Turn",
    "next_tenant",
    "queued_wall_seconds",
    "tenant_order",
]

S = JobState
ACTIVE = (S.STARTING, S.RUNNING, S.CANCELLING)
DEFAULT_WALL_TIME_S = 6 * 3600  # a stored spec without ``limits.max_wall_time_s``


@dataclass(frozen=True)
class Turn:
    """One tenant's place in the order (the fields, in the order they count)."""

    tenant_id: str
    running: int
    last_start: datetime | None  # of the tenant's latest attempt; None: never started
    oldest: datetime  # created_at of its oldest waiting job
    waiting: int  # its waiting jobs in this placement

    def key(self) -> tuple[int, int, datetime, datetime, str]:
        never = self.last_start is None
        started = self.oldest if self.last_start is None else self.last_start
        return (self.running, 0 if never else 1, started, self.oldest, self.tenant_id)


def _in_placement(devices: int, nodes: int) -> list[ColumnElement[bool]]:
    training = Job.spec["training"]
    return [
        func.coalesce(training["devices"].as_integer(), 1) == devices,
        func.coalesce(training["nodes"].as_integer(), 1) == nodes,
    ]


def tenant_order(
    *, session: Session, devices: int = 1, nodes: int = 1, include: str | None = None
) -> list[Turn]:
    """The tenants with a job waiting in the queue of ``devices`` x ``nodes``, whose turn
    first; ``include``: a job id that counts as waiting even while its ``enqueue_pending``
    flag is still set (the job of the message in hand, sent before the flag was cleared)."""
    sent = Job.enqueue_pending.is_(False)
    waiting_now = or_(sent, Job.id == include) if include is not None else sent
    rows = session.execute(
        select(Job.tenant_id, func.count(), func.min(Job.created_at))
        .where(Job.state == S.QUEUED.value, waiting_now, *_in_placement(devices, nodes))
        .group_by(Job.tenant_id)
    ).all()
    if not rows:
        return []
    tenants = [r[0] for r in rows]
    running = dict(
        session.execute(
            select(Job.tenant_id, func.count())
            .where(Job.state.in_([a.value for a in ACTIVE]), Job.tenant_id.in_(tenants))
            .group_by(Job.tenant_id)
        ).all()
    )
    started = dict(
        session.execute(
            select(JobAttempt.tenant_id, func.max(JobAttempt.started_at))
            .where(JobAttempt.tenant_id.in_(tenants), JobAttempt.started_at.is_not(None))
            .group_by(JobAttempt.tenant_id)
        ).all()
    )
    turns = [
        Turn(
            tenant_id=tenant,
            running=int(running.get(tenant, 0)),
            last_start=as_utc(started[tenant]) if started.get(tenant) else None,
            oldest=as_utc(oldest),
            waiting=int(count),
        )
        for tenant, count, oldest in rows
    ]
    return sorted(turns, key=Turn.key)


@dataclass(frozen=True)
class Decision:
    """For the message of one job: whose turn it is, and how many jobs wait in its queue."""

    turn: str | None  # the tenant whose turn it is; None: the job does not wait (yet)
    tenant_id: str | None  # the job's tenant
    waiting: int  # jobs waiting in the job's placement queue, all tenants
    devices: int = 1  # the job's placement (``service.store.placement``)
    nodes: int = 1

    @property
    def its_turn(self) -> bool:
        return self.turn is None or self.turn == self.tenant_id


def next_tenant(*, session: Session, job_id: str, attempt: int) -> Decision:
    """Whose turn it is in the queue of the job's placement, for the message of ``job_id``
    ``attempt``. A job that is gone, no longer QUEUED or at another attempt gets ``turn``
    None: its message is not one to hold back (the claim check turns it into a no-op)."""
    job = session.get(Job, job_id)
    if job is None or job.state != S.QUEUED.value or job.attempt != attempt:
        return Decision(turn=None, tenant_id=None, waiting=0)
    where = placement(job.spec)
    order = tenant_order(session=session, **where, include=job_id)
    return Decision(
        turn=order[0].tenant_id if order else None,
        tenant_id=job.tenant_id,
        waiting=sum(t.waiting for t in order),
        **where,
    )


def queued_wall_seconds(*, session: Session, tenant_id: str) -> int:
    """The sum of ``limits.max_wall_time_s`` over the tenant's QUEUED jobs (the quota
    ``max_queued_wall_seconds_per_tenant``, checked at submission)."""
    wall = func.coalesce(Job.spec["limits"]["max_wall_time_s"].as_integer(), DEFAULT_WALL_TIME_S)
    total = session.scalar(
        select(func.coalesce(func.sum(wall), 0)).where(
            Job.tenant_id == tenant_id, Job.state == S.QUEUED.value
        )
    )
    return int(total or 0)
