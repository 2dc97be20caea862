"""Liveness (``/v1/healthz``), readiness (``/v1/readyz``) and Prometheus (``/metrics``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from api_schemas import HealthPublic
from service.api.deps import SettingsDep
from service.errors import problem_response, problems
from service.readiness import check_broker, check_database

router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthPublic)
def healthz() -> HealthPublic:
    """The process is up (no dependency is checked)."""
    return HealthPublic(status="ok")


@router.get("/readyz", response_model=HealthPublic, responses=problems(503))
async def readyz(request: Request, settings: SettingsDep) -> HealthPublic | Response:
    """The database and the broker answer (503 problem naming the failing one otherwise)."""
    db = await run_in_threadpool(check_database, request.app.state.engine)
    broker = await run_in_threadpool(check_broker, settings.broker)
    checks = {"database": db or "ok", "broker": broker or "ok"}
    if db or broker:
        down = ", ".join(k for k, v in checks.items() if v != "ok")
        return problem_response(
            503, f"Not ready: {down} unavailable.", checks=checks, headers={"Retry-After": "5"}
        )
    return HealthPublic(status="ready", checks=checks)


@metrics_router.get(
    "/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}}
)
def metrics(request: Request) -> Response:
    """Prometheus text format: request counts and latency by route, jobs by state."""
    body = generate_latest(request.app.state.telemetry.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
