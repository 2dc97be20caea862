"""Jobs: creation, compare-and-set state transitions and the event log.

Every state change is one conditional ``UPDATE … WHERE id = ? AND state IN (…)`` (plus the
version when the caller holds one) that bumps ``version`` and appends a ``state`` event in the
same transaction. Zero rows updated means someone else moved the job first: the caller lost
the race and must not act. A terminal state is never left except by an explicit retry.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from api_schemas import TERMINAL_STATES, JobState
from service.store.db.models import Job, JobAttempt, JobEvent, utcnow
from service.store.ids import new_id

__all__ = ["ALLOWED", "append_event", "create_job", "get_job", "transition"]

S = JobState
# docs/service.md#job-states (a retry leaves a terminal state)
ALLOWED: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED}),
    S.STARTING: frozenset({S.RUNNING, S.QUEUED, S.FAILED, S.CANCELLING, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING}),
    S.CANCELLING: frozenset({S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset({S.QUEUED}),
    S.CANCELLED: frozenset({S.QUEUED}),
}


def create_job(
    *,
    session: Session,
    tenant_id: str,
    name: str,
    labels: dict[str, str],
    spec: dict[str, Any],
    spec_hash: str,
    max_attempts: int,
) -> Job:
    """A QUEUED job, its attempt 1 and its first event (the caller commits, then enqueues)."""
    now = utcnow()
    job = Job(
        id=new_id("job"),
        tenant_id=tenant_id,
        name=name,
        labels=labels,
        state=S.QUEUED.value,
        version=1,
        attempt=1,
        max_attempts=max_attempts,
        spec=spec,
        spec_hash=spec_hash,
        progress={},
        compression={},
        event_seq=0,
        created_at=now,
        updated_at=now,
        message="queued",
    )
    session.add(job)
    session.add(JobAttempt(job_id=job.id, tenant_id=tenant_id, attempt=1))
    session.flush()
    append_event(
        session=session,
        job_id=job.id,
        attempt=1,
        kind="state",
        data={"state": S.QUEUED.value, "attempt": 1},
    )
    return job


def get_job(
    *, session: Session, job_id: str, tenant_id: str | None = None, for_update: bool = False
) -> Job | None:
    """The job, or None; with ``tenant_id`` another tenant's job is None too (a 404)."""
    q = select(Job).where(Job.id == job_id)
    if tenant_id is not None:
        q = q.where(Job.tenant_id == tenant_id)
    if for_update:
        q = q.with_for_update()
    return session.scalars(q).first()


def append_event(
    *,
    session: Session,
    job_id: str,
    attempt: int,
    kind: str,
    data: dict[str, Any],
    t: datetime | None = None,
) -> int:
    """Append one event (with its job's tenant); returns its sequence number (per job, from
    1, gap-free)."""
    seq, tenant_id = session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(event_seq=Job.event_seq + 1)
        .returning(Job.event_seq, Job.tenant_id)
    ).one()
    session.add(
        JobEvent(
            job_id=job_id,
            tenant_id=tenant_id,
            seq=seq,
            attempt=attempt,
            kind=kind,
            data=data,
            t=t or utcnow(),
        )
    )
    return seq


def transition(
    *,
    session: Session,
    job_id: str,
    from_states: Iterable[JobState],
    to_state: JobState,
    version: int | None = None,
    attempt: int | None = None,
    where: Iterable[ColumnElement[bool]] = (),
    next_attempt: bool = False,
    event: dict[str, Any] | None = None,
    **values: Any,
) -> Job | None:
    """Compare-and-set ``state`` from one of ``from_states`` to ``to_state``.

    ``version`` / ``attempt``: also require them to match; ``where``: more conditions (the
    reaper's "the lease is still expired and still this owner's"). ``next_attempt``: bump
    ``attempt`` in the same statement (the event names the new one). ``values``: other
    columns to set. Returns the updated job, or None when nothing matched.
    """
    sources = [s for s in from_states if to_state in ALLOWED[JobState(s)]]
    if not sources:
        raise ValueError(f"no allowed transition to {to_state} from {list(from_states)}")
    now = utcnow()
    q = update(Job).where(Job.id == job_id, Job.state.in_([s.value for s in sources]))
    if version is not None:
        q = q.where(Job.version == version)
    if attempt is not None:
        q = q.where(Job.attempt == attempt)
    q = q.where(*where)
    if next_attempt:
        values["attempt"] = Job.attempt + 1
    if to_state in TERMINAL_STATES:
        values.setdefault("finished_at", now)
        values.setdefault("lease_owner", None)
        values.setdefault("lease_expires_at", None)
    q = q.values(state=to_state.value, version=Job.version + 1, updated_at=now, **values)
    # no in-Python evaluation of the criteria on loaded jobs (SQLite hands back naive
    # timestamps): every loaded job is expired below instead
    q = q.execution_options(synchronize_session=False)
    row = session.execute(q.returning(Job.attempt)).first()
    if row is None:
        return None
    data = {"state": to_state.value, "attempt": row[0], **(event or {})}
    append_event(session=session, job_id=job_id, attempt=row[0], kind="state", data=data, t=now)
    session.expire_all()
    return get_job(session=session, job_id=job_id)
