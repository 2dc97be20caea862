"""Rows to wire types: ``JobPublic``, checkpoints, datasets, attempts, events and points.

Timestamps always leave as UTC-aware values (SQLite hands back naive ones). JSON columns
written by the worker (``progress``, ``error``) are read leniently: a malformed value must
not turn a status call into a 500.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from api_schemas import (
    AttemptPublic,
    CheckpointPublic,
    DatasetPublic,
    EventPublic,
    JobPublic,
    MetricPoint,
    Problem,
    RankPoint,
    UploadedModelPublic,
)
from api_schemas.artifacts import ModelFilePublic
from api_schemas.job_public import ProgressPublic
from service.store.db.crud.pagination import as_utc
from service.store.db.models import Checkpoint, Dataset, Job, JobAttempt, JobEvent, UploadedModel

__all__ = [
    "attempt_public",
    "model_public",
    "checkpoint_public",
    "dataset_public",
    "event_public",
    "job_links",
    "job_public",
    "metric_point",
    "rank_point",
    "utc",
]


def utc(t: datetime | None) -> datetime | None:
    return None if t is None else as_utc(t)


def job_links(job_id: str) -> dict[str, str]:
    base = f"/v1/jobs/{job_id}"
    names = ("events", "metrics", "ranks", "checkpoints", "report", "attempts", "cancel", "retry")
    return {"self": base, **{n: f"{base}/{n}" for n in names}}


def _progress(raw: dict[str, Any] | None) -> ProgressPublic:
    try:
        progress = ProgressPublic.model_validate(raw or {})
    except ValidationError:
        return ProgressPublic()
    if progress.fraction is None and progress.total_steps:
        progress.fraction = min(1.0, progress.step / progress.total_steps)
    return progress


def _error(raw: dict[str, Any] | None) -> Problem | None:
    if not raw:
        return None
    try:
        return Problem.model_validate(raw)
    except ValidationError:
        return Problem(title="Job failed", status=500, detail=str(raw.get("detail", raw)))


def job_public(job: Job, latest: dict[str, float] | None = None) -> JobPublic:
    return JobPublic(
        id=job.id,
        name=job.name,
        labels=job.labels or {},
        state=job.state,
        message=job.message,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        version=job.version,
        progress=_progress(job.progress),
        latest_metrics=latest or {},
        compression=job.compression or {},
        error=_error(job.error),
        enqueue_pending=job.enqueue_pending,
        cancel_requested_at=utc(job.cancel_requested_at),
        created_at=as_utc(job.created_at),
        started_at=utc(job.started_at),
        finished_at=utc(job.finished_at),
        updated_at=as_utc(job.updated_at),
        spec=job.spec,
        spec_hash=job.spec_hash,
        engine_version=job.engine_version,
        links=job_links(job.id),
    )


def attempt_public(a: JobAttempt, *, show_worker: bool = False) -> AttemptPublic:
    """``show_worker``: name the worker (``host:pid``; admin keys only, it is the server's)."""
    return AttemptPublic(
        attempt=a.attempt,
        worker=a.worker if show_worker else None,
        started_at=utc(a.started_at),
        ended_at=utc(a.ended_at),
        exit_reason=a.exit_reason,
        resume_from=a.resume_from,
    )


def checkpoint_public(c: Checkpoint) -> CheckpointPublic:
    base = f"/v1/jobs/{c.job_id}/checkpoints/{c.id}"
    return CheckpointPublic(
        id=c.id,
        job_id=c.job_id,
        attempt=c.attempt,
        kind=c.kind,
        step=c.step,
        stage=c.stage,
        metrics=c.metrics or {},
        size_bytes=c.size_bytes,
        sha256=c.sha256,
        format=c.format,
        state=c.state,
        created_at=as_utc(c.created_at),
        links={"self": base, "content": f"{base}/content", "manifest": f"{base}/manifest"},
    )


def dataset_public(d: Dataset) -> DatasetPublic:
    return DatasetPublic(
        id=d.id,
        name=d.name,
        format=d.format,
        size_bytes=d.size_bytes,
        sha256=d.sha256,
        rows=d.rows,
        state=d.state,
        error=d.error,
        created_at=as_utc(d.created_at),
    )


def model_public(m: UploadedModel) -> UploadedModelPublic:
    return UploadedModelPublic(
        id=m.id,
        name=m.name,
        model_type=m.model_type,
        size_bytes=m.size_bytes,
        sha256=m.sha256,
        files={k: ModelFilePublic(**v) for k, v in (m.files or {}).items()},
        created_at=as_utc(m.created_at),
    )


def event_public(e: JobEvent) -> EventPublic:
    return EventPublic(seq=e.seq, kind=e.kind, attempt=e.attempt, data=e.data or {}, t=as_utc(e.t))


def metric_point(p: Any) -> MetricPoint:
    return MetricPoint(
        step=p["step"], value=p["value"], stage=p["stage"], epoch=p["epoch"], t=as_utc(p["t"])
    )


def rank_point(p: Any) -> RankPoint:
    return RankPoint(
        step=p["step"],
        stage=p["stage"],
        tensor=p["tensor"],
        kind=p["kind"],
        ranks=p["ranks"],
        params=p["params"],
        dense=p["dense"],
        ratio=p["ratio"],
        t=as_utc(p["t"]),
    )
