"""Prometheus metrics of the API (``GET /metrics``; docs/service.md#observability).

Each app owns a ``CollectorRegistry`` (several apps in one process, as in tests, never clash):
a request counter and a latency histogram labelled by the *route template*
(``/v1/jobs/{job_id}``, so ids never explode the label set), and gauges of jobs by state and
of the oldest queued job's age, read from the database at scrape time (the workers write to
the database; the API exports).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api_schemas import JobState
from service.store.db.models import Job, utcnow

__all__ = ["JobsCollector", "RequestMetricsMiddleware", "Telemetry", "route_template"]


def route_template(scope: Scope) -> str:
    """``/v1/jobs/{job_id}`` for ``/v1/jobs/job_01J…``: the matched path with each path
    parameter's value put back as ``{name}`` (unrouted requests: ``<unmatched>``)."""
    if scope.get("route") is None:
        return "<unmatched>"
    names = {str(v): k for k, v in (scope.get("path_params") or {}).items()}
    return "/".join(f"{{{names[s]}}}" if s in names else s for s in scope["path"].split("/"))


class JobsCollector(Collector):
    """``comera_jobs{state}`` and ``comera_oldest_queued_job_age_seconds`` from SQL."""

    def __init__(self, sessions: Callable[[], Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("comera_jobs", "Jobs by state (all tenants)", labels=["state"])
        oldest = GaugeMetricFamily(
            "comera_oldest_queued_job_age_seconds", "Age of the oldest QUEUED job (0 when none)"
        )
        with self.sessions() as session:
            by_state = select(Job.state, func.count()).group_by(Job.state)
            counts = dict(session.execute(by_state).all())
            first = session.scalar(
                select(func.min(Job.created_at)).where(Job.state == JobState.QUEUED.value)
            )
        for state in JobState:
            jobs.add_metric([state.value], counts.get(state.value, 0))
        if first is not None and first.tzinfo is None:
            first = first.replace(tzinfo=utcnow().tzinfo)
        oldest.add_metric([], 0.0 if first is None else (utcnow() - first).total_seconds())
        yield jobs
        yield oldest


class Telemetry:
    """The registry and the instruments of one app."""

    def __init__(self, sessions: Callable[[], Session]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "comera_http_requests_total",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "comera_http_request_duration_seconds",
            "Request latency",
            ["method", "route"],
            registry=self.registry,
        )
        self.registry.register(JobsCollector(sessions))


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by method, route template and status."""

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry) -> None:
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = route_template(scope)
            method = scope["method"]
            self.telemetry.requests.labels(method, route, str(status)).inc()
            self.telemetry.latency.labels(method, route).observe(time.perf_counter() - t0)
