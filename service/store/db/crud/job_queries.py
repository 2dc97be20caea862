"""Reading jobs: the filtered, keyset-paginated list, latest metrics and attempts.

Every function filters on ``tenant_id`` (another tenant's job does not exist:
docs/service.md#authentication-and-tenancy). Label and model filters compare JSON members in
SQL (``->>`` on PostgreSQL, ``json_extract`` on SQLite), so a page is always ``limit`` rows
when that many match.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api_schemas import TERMINAL_STATES, JobState
from service.store.db.crud.pagination import keyset_page
from service.store.db.models import Job, JobAttempt, LatestMetric

__all__ = [
    "JobFilter",
    "count_jobs",
    "latest_metrics",
    "list_attempts",
    "list_jobs",
    "unfinished_job_refers",
]


@dataclass(frozen=True)
class JobFilter:
    states: Sequence[JobState] = ()
    labels: dict[str, str] = field(default_factory=dict)
    q: str | None = None  # case-insensitive substring of the name
    model: str | None = None  # architecture (spec.model.arch)
    created_after: datetime | None = None
    created_before: datetime | None = None


def list_jobs(
    *, session: Session, tenant_id: str, where: JobFilter, cursor: str | None, limit: int
) -> tuple[list[Job], str | None]:
    """One page of the tenant's jobs, newest first; ``ValueError`` on a bad cursor."""
    q = select(Job).where(Job.tenant_id == tenant_id)
    if where.states:
        q = q.where(Job.state.in_([s.value for s in where.states]))
    for key, value in where.labels.items():
        q = q.where(Job.labels[key].as_string() == value)
    if where.q:
        q = q.where(Job.name.icontains(where.q, autoescape=True))
    if where.model:
        q = q.where(Job.spec[("model", "arch")].as_string() == where.model)
    if where.created_after is not None:
        q = q.where(Job.created_at > where.created_after)
    if where.created_before is not None:
        q = q.where(Job.created_at < where.created_before)
    return keyset_page(
        session=session, query=q, created=Job.created_at, ident=Job.id, cursor=cursor, limit=limit
    )


def count_jobs(*, session: Session, tenant_id: str, states: Iterable[JobState]) -> int:
    q = (
        select(func.count())
        .select_from(Job)
        .where(Job.tenant_id == tenant_id, Job.state.in_([s.value for s in states]))
    )
    return int(session.scalar(q) or 0)


def latest_metrics(
    *, session: Session, tenant_id: str, job_ids: Sequence[str]
) -> dict[str, dict[str, float]]:
    """``{job_id: {key: value}}`` from the summary table (never the series:
    docs/service.md#progress-and-series)."""
    out: dict[str, dict[str, float]] = {j: {} for j in job_ids}
    if job_ids:
        rows = session.scalars(
            select(LatestMetric).where(
                LatestMetric.tenant_id == tenant_id, LatestMetric.job_id.in_(job_ids)
            )
        )
        for row in rows:
            out[row.job_id][row.key] = row.value
    return out


def list_attempts(*, session: Session, tenant_id: str, job_id: str) -> list[JobAttempt]:
    q = select(JobAttempt).where(JobAttempt.tenant_id == tenant_id, JobAttempt.job_id == job_id)
    q = q.order_by(JobAttempt.attempt)
    return list(session.scalars(q))


def unfinished_job_refers(
    *, session: Session, tenant_id: str, path: tuple[str, ...], value: str
) -> bool:
    """Whether a job of the tenant that has not finished has ``value`` at ``path`` of its spec
    (``("dataset", "dataset_id")``: it reads that upload)."""
    q = select(Job.spec).where(
        Job.tenant_id == tenant_id,
        Job.state.not_in([s.value for s in TERMINAL_STATES]),
        Job.spec[path].as_string() == value,
    )
    return session.scalars(q.limit(1)).first() is not None
