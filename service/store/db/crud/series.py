"""Reading a job's time series: metric points, rank points and the event log.

Downsampling is done in SQL, by row number (NTILE style, MLflow #24169): for a series of
``n`` points and ``m = max_points < n``, the rows kept are ``floor(i * (n - 1) / (m - 1))``
for ``i = 0 .. m - 1``: exactly ``m`` rows, evenly spaced, the first and the last always
among them. Row ``r`` is one of those iff ``(-r * (m - 1)) mod (n - 1) < m - 1``, which is
what the ``WHERE`` clause tests, so a million-point series never leaves the database whole.

Every read filters on the tenant as well as the job
(docs/service.md#authentication-and-tenancy): given another tenant's job id it
finds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.orm import Session

from service.store.db.models import JobEvent, MetricPoint, RankPoint

__all__ = ["Series", "events_after", "glob_to_like", "metric_series", "rank_series"]


@dataclass
class Series:
    name: str
    total: int  # points matching the filters, before downsampling
    rows: list[Any]  # row mappings: the table's columns plus rn, n


def glob_to_like(pattern: str) -> str:
    """``encoder.*.ffn?`` -> ``encoder.%.ffn_`` (``\\`` escapes LIKE's own wildcards)."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def _job_points(
    model: Any, tenant_id: str, job_id: str, stage: str | None, from_step: int | None
) -> list[ColumnElement[bool]]:
    """Filters for the job's rows of ``model`` (of ``stage``, from ``from_step``, if given)."""
    filters: list[ColumnElement[bool]] = [model.tenant_id == tenant_id, model.job_id == job_id]
    if stage is not None:
        filters.append(model.stage == stage)
    if from_step is not None:
        filters.append(model.step >= from_step)
    return filters


def _downsampled(
    session: Session, model: Any, group: Any, filters: list[ColumnElement[bool]], max_points: int
) -> dict[str, Series]:
    """Rows of ``model`` matching ``filters``, per ``group`` value, downsampled by row."""
    m = max_points
    inner = (
        select(
            model,
            (func.row_number().over(partition_by=group, order_by=model.step) - 1).label("rn"),
            func.count().over(partition_by=group).label("n"),
        )
        .where(and_(*filters))
        .subquery()
    )
    n, rn = inner.c.n, inner.c.rn
    keep = case((n <= m, True), else_=((n - 1) - (rn * (m - 1)) % (n - 1)) % (n - 1) < m - 1)
    q = select(inner).where(keep).order_by(inner.c[group.key], inner.c.step)
    out: dict[str, Series] = {}
    for row in session.execute(q):
        point = row._mapping
        name = point[group.key]
        out.setdefault(name, Series(name, point["n"], [])).rows.append(point)
    return out


def metric_series(
    *,
    session: Session,
    tenant_id: str,
    job_id: str,
    keys: Sequence[str] | None,
    stage: str | None,
    from_step: int | None,
    to_step: int | None,
    max_points: int,
) -> list[Series]:
    """One series per key (all keys of the job when ``keys`` is None), sorted by step."""
    filters = _job_points(MetricPoint, tenant_id, job_id, stage, from_step)
    if keys is not None:
        filters.append(MetricPoint.key.in_(keys))
    if to_step is not None:
        filters.append(MetricPoint.step <= to_step)
    found = _downsampled(session, MetricPoint, MetricPoint.key, filters, max_points)
    names = list(keys) if keys is not None else sorted(found)
    return [found.get(k, Series(k, 0, [])) for k in names]


def rank_series(
    *,
    session: Session,
    tenant_id: str,
    job_id: str,
    tensor: str | None,
    stage: str | None,
    from_step: int | None,
    max_points: int,
) -> list[Series]:
    """Rank points per tensor (``tensor``: a glob with ``*`` and ``?``), sorted by step."""
    filters = _job_points(RankPoint, tenant_id, job_id, stage, from_step)
    if tensor is not None:
        filters.append(RankPoint.tensor.like(glob_to_like(tensor), escape="\\"))
    found = _downsampled(session, RankPoint, RankPoint.tensor, filters, max_points)
    return [found[k] for k in sorted(found)]


def events_after(
    *,
    session: Session,
    tenant_id: str,
    job_id: str,
    after: int,
    limit: int,
    kinds: Sequence[str] | None = None,
) -> list[JobEvent]:
    """Events with ``seq > after`` in order, at most ``limit``."""
    q = select(JobEvent).where(
        JobEvent.tenant_id == tenant_id, JobEvent.job_id == job_id, JobEvent.seq > after
    )
    if kinds:
        q = q.where(JobEvent.kind.in_(kinds))
    return list(session.scalars(q.order_by(JobEvent.seq).limit(limit)))
