"""Time series of a job: metric points, rank points (the rank trajectory) and events."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from api_schemas.common import Page

__all__ = [
    "EventPublic",
    "EventsPublic",
    "MetricPoint",
    "MetricSeries",
    "MetricsPublic",
    "RankPoint",
    "RanksPublic",
    "EVENT_KINDS",
]

EVENT_KINDS = ("state", "stage", "metric", "rank", "checkpoint", "log", "heartbeat")


class MetricPoint(BaseModel):
    step: int
    value: float
    stage: str | None = None
    epoch: float | None = None
    t: datetime


class MetricSeries(BaseModel):
    key: str
    points: list[MetricPoint]
    total_points: int  # before downsampling
    downsampled: bool


class MetricsPublic(BaseModel):
    job_id: str
    series: list[MetricSeries]


class RankPoint(BaseModel):
    """One layer's ranks at a step: the active bond ranks, its size and compression."""

    step: int
    stage: str | None = None
    tensor: str
    kind: str  # "tt_linear" | "ttm_embedding"
    ranks: list[int]
    params: int
    dense: int
    ratio: float
    t: datetime


class RanksPublic(BaseModel):
    job_id: str
    points: list[RankPoint]
    next_cursor: str | None = None


class EventPublic(BaseModel):
    seq: int
    kind: Literal["state", "stage", "metric", "rank", "checkpoint", "log", "heartbeat"]
    attempt: int
    data: dict[str, Any]
    t: datetime


class EventsPublic(Page[EventPublic]):
    pass
