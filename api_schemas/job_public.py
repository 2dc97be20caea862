"""The job resource as the API returns it (``JobPublic``, a page of them, its progress)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from api_schemas.common import Page, Problem
from api_schemas.jobs import JobState

__all__ = ["JobPublic", "JobsPublic", "ProgressPublic"]


class ProgressPublic(BaseModel):
    step: int = 0
    total_steps: int | None = None
    fraction: float | None = None
    stage_index: int | None = None
    stage_name: str | None = None
    stage_count: int | None = None


class JobPublic(BaseModel):
    id: str
    name: str
    labels: dict[str, str]
    state: JobState
    message: str | None = None
    attempt: int
    max_attempts: int
    version: int
    progress: ProgressPublic
    latest_metrics: dict[str, float] = Field(default_factory=dict)
    compression: dict[str, Any] = Field(default_factory=dict)
    error: Problem | None = None
    enqueue_pending: bool = False
    cancel_requested_at: datetime | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime
    spec: dict[str, Any]
    spec_hash: str
    engine_version: str | None = None
    links: dict[str, str] = Field(default_factory=dict)


class JobsPublic(Page[JobPublic]):
    pass
