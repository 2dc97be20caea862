"""Rows to wire types: ``JobPublic``, checkpoints, datasets, attempts, events and points.

Timestamps always leave as UTC-aware values (SQLite hands back naive ones). JSON columns
written by the worker (``progress``, ``error``) are read leniently: a malformed value must
not turn a status call into a 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

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
]


Wire = TypeVar("Wire", bound=BaseModel)


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


def _wire(model: type[Wire], row: Any, **given: Any) -> Wire:
    """``model`` with each field not ``given`` read from the attribute of ``row`` of the same
    name (the key, for a result row mapping); timestamps as UTC-aware values."""
    get = row.__getitem__ if isinstance(row, Mapping) else partial(getattr, row)
    read = {name: get(name) for name in model.model_fields if name not in given}
    read = {k: as_utc(v) if isinstance(v, datetime) else v for k, v in read.items()}
    return model(**read, **given)


def job_public(job: Job, latest: dict[str, float] | None = None) -> JobPublic:
    return _wire(
        JobPublic,
        job,
        labels=job.labels or {},
        progress=_progress(job.progress),
        latest_metrics=latest or {},
        compression=job.compression or {},
        error=_error(job.error),
        links=job_links(job.id),
    )


def attempt_public(a: JobAttempt, *, show_worker: bool = False) -> AttemptPublic:
    """``show_worker``: name the worker (``host:pid``; admin keys only, it is the server's)."""
    return _wire(AttemptPublic, a, worker=a.worker if show_worker else None)


def checkpoint_public(c: Checkpoint) -> CheckpointPublic:
    base = f"/v1/jobs/{c.job_id}/checkpoints/{c.id}"
    links = {"self": base, "content": f"{base}/content", "manifest": f"{base}/manifest"}
    return _wire(CheckpointPublic, c, metrics=c.metrics or {}, links=links)


def dataset_public(d: Dataset) -> DatasetPublic:
    return _wire(DatasetPublic, d)


def model_public(m: UploadedModel) -> UploadedModelPublic:
    files = {k: ModelFilePublic(**v) for k, v in (m.files or {}).items()}
    return _wire(UploadedModelPublic, m, files=files)


def event_public(e: JobEvent) -> EventPublic:
    return _wire(EventPublic, e, data=e.data or {})


def metric_point(p: Mapping[str, Any]) -> MetricPoint:
    return _wire(MetricPoint, p)


def rank_point(p: Mapping[str, Any]) -> RankPoint:
    return _wire(RankPoint, p)
