"""Writing a running job's batched points and its live summary (``worker.recorder``).

Metric and rank points and the latest value per key are upserts on their unique keys
(``INSERT … ON CONFLICT DO UPDATE`` on PostgreSQL and SQLite), so an attempt that replays steps
overwrites its points instead of duplicating them. ``jobs.progress`` and ``jobs.compression``
are written only while the job is still on the writer's attempt. The caller commits.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.store.db.models import Job, LatestMetric, MetricPoint, RankPoint

__all__ = [
    "LATEST_COLUMNS",
    "METRIC_COLUMNS",
    "RANK_COLUMNS",
    "set_attempt_summary",
    "upsert",
    "write_points",
]

METRIC_COLUMNS = ["attempt", "stage", "epoch", "value", "t"]  # updated when a step is replayed
RANK_COLUMNS = ["attempt", "stage", "kind", "ranks", "params", "dense", "ratio", "t"]
LATEST_COLUMNS = ["step", "value", "t"]


def upsert(
    *,
    session: Session,
    table: Table,
    rows: list[dict[str, Any]],
    keys: list[str],
    columns: list[str],
) -> None:
    """``INSERT … ON CONFLICT (keys) DO UPDATE SET columns = excluded.columns`` for ``rows``."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=keys, set_={c: stmt.excluded[c] for c in columns}
    )
    session.execute(stmt, rows)


def write_points(
    *,
    session: Session,
    metrics: list[dict[str, Any]],
    ranks: list[dict[str, Any]],
    latest: list[dict[str, Any]],
) -> None:
    """Upsert metric points on ``(job, key, step)``, rank points on ``(job, tensor, step)`` and
    the latest metrics on ``(job, key)``, in that order (rows: the tables' columns)."""
    for table, rows, keys, columns in (
        (MetricPoint.__table__, metrics, ["job_id", "key", "step"], METRIC_COLUMNS),
        (RankPoint.__table__, ranks, ["job_id", "tensor", "step"], RANK_COLUMNS),
        (LatestMetric.__table__, latest, ["job_id", "key"], LATEST_COLUMNS),
    ):
        upsert(session=session, table=table, rows=rows, keys=keys, columns=columns)


def set_attempt_summary(
    *, session: Session, job_id: str, attempt: int, values: dict[str, Any]
) -> None:
    """Set ``values`` (``progress``, ``compression``) on the job if it is still on ``attempt``:
    a worker that lost its lease never overwrites its successor's."""
    session.execute(update(Job).where(Job.id == job_id, Job.attempt == attempt).values(**values))
