"""``/v1/jobs/{id}/metrics``, ``/ranks`` and ``/events`` (a JSON page or server-sent events)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse

from api_schemas import EventsPublic, MetricSeries, MetricsPublic, RanksPublic
from api_schemas.series import EVENT_KINDS
from service.api.deps import JobDep, SessionDep
from service.errors import FieldProblem, problems
from service.events_stream import PING_S, event_stream, wants_event_stream
from service.store.db.crud.series import events_after, metric_series, rank_series
from service.views import event_public, metric_point, rank_point

router = APIRouter(prefix="/jobs/{job_id}", tags=["series"])


INT32 = 2**31 - 1  # steps and sequence numbers are 32-bit columns: larger is a 422, not a 500


def _names(raw: str | None) -> list[str] | None:
    return None if raw is None else [k.strip() for k in raw.split(",") if k.strip()]


class MetricsQuery(BaseModel):
    keys: str | None = Field(None, max_length=1024, description="comma list; default: all")
    stage: str | None = Field(None, max_length=64)
    from_step: int | None = Field(None, ge=0, le=INT32)
    to_step: int | None = Field(None, ge=0, le=INT32)
    max_points: int = Field(500, ge=2, le=5000, description="per key; evenly spaced rows")


class RanksQuery(BaseModel):
    tensor: str | None = Field(None, max_length=256, description="glob (* and ?)")
    stage: str | None = Field(None, max_length=64)
    from_step: int | None = Field(None, ge=0, le=INT32)
    max_points: int = Field(500, ge=2, le=5000, description="per tensor; evenly spaced rows")


class EventsQuery(BaseModel):
    after: int = Field(0, ge=0, le=INT32, description="sequence number to resume after")
    limit: int = Field(100, ge=1, le=1000, description="page size (JSON only)")
    kind: str | None = Field(None, max_length=128, description="comma list of event kinds")

    def kinds(self) -> list[str] | None:
        kinds = _names(self.kind)
        if kinds and (bad := sorted(set(kinds) - set(EVENT_KINDS))):
            raise FieldProblem.param("kind", f"unknown kind(s) {bad}; one of {list(EVENT_KINDS)}")
        return kinds or None


@router.get("/metrics", response_model=MetricsPublic, responses=problems(404, 422))
def read_metrics(
    job: JobDep, session: SessionDep, params: Annotated[MetricsQuery, Query()]
) -> MetricsPublic:
    """Metric series per key, downsampled by row to ``max_points`` (first and last kept)."""
    found = metric_series(
        session=session,
        tenant_id=job.tenant_id,
        job_id=job.id,
        keys=_names(params.keys),
        stage=params.stage,
        from_step=params.from_step,
        to_step=params.to_step,
        max_points=params.max_points,
    )
    series = [
        MetricSeries(
            key=s.name,
            points=[metric_point(p) for p in s.rows],
            total_points=s.total,
            downsampled=s.total > len(s.rows),
        )
        for s in found
    ]
    return MetricsPublic(job_id=job.id, series=series)


@router.get("/ranks", response_model=RanksPublic, responses=problems(404, 422))
def read_ranks(
    job: JobDep, session: SessionDep, params: Annotated[RanksQuery, Query()]
) -> RanksPublic:
    """The rank trajectory: per tensor and step, the active ranks, size and ratio."""
    found = rank_series(
        session=session,
        tenant_id=job.tenant_id,
        job_id=job.id,
        tensor=params.tensor,
        stage=params.stage,
        from_step=params.from_step,
        max_points=params.max_points,
    )
    return RanksPublic(job_id=job.id, points=[rank_point(p) for s in found for p in s.rows])


@router.get(
    "/events",
    response_model=EventsPublic,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "A JSON page, or an SSE stream"},
        **problems(404, 406, 422),
    },
)
def read_events(
    job: JobDep,
    session: SessionDep,
    request: Request,
    params: Annotated[EventsQuery, Query()],
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[int | None, Header(ge=0, le=INT32)] = None,
) -> Any:
    """Events after ``after`` (or ``Last-Event-ID``): a page, or with
    ``Accept: text/event-stream`` a stream that ends after the job's terminal state."""
    sse, kinds = wants_event_stream(accept), params.kinds()
    if sse is None:
        raise HTTPException(406, "Acceptable: application/json or text/event-stream.")
    after = max(params.after, last_event_id or 0)
    if sse:
        session.close()  # the stream opens its own short sessions; hold no connection
        stream = event_stream(request.app.state.sessionmaker, job.tenant_id, job.id, after, kinds)
        return EventSourceResponse(stream, ping=PING_S, headers={"Cache-Control": "no-cache"})
    events = events_after(
        session=session,
        tenant_id=job.tenant_id,
        job_id=job.id,
        after=after,
        limit=params.limit + 1,
        kinds=kinds,
    )
    page = events[: params.limit]
    cursor = str(page[-1].seq) if len(events) > params.limit else None
    return EventsPublic(items=[event_public(e) for e in page], next_cursor=cursor)
