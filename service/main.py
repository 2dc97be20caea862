"""The FastAPI app: ``create_app(settings)``; ``uvicorn --factory service.main:create_app``.

The lifespan builds the engine and sessionmaker from ``settings.db_url`` and refuses to start
unless the database schema is at the Alembic head this code expects (migrations run as their
own step, ``service.store.db.migrate.upgrade``: docs/service.md#sql-and-migrations). Middleware,
outermost first: the guard that answers an unhandled error without dropping the connection,
Prometheus request metrics, the NUL guard (``service.nul_guard``: a NUL in the path, query or
headers is a 422), admission control, then the request body limit (the dataset upload
route has its own).
Errors are problem+json (``service.errors``). Nothing here imports torch: planning runs in a
spawned child process.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy import Engine

from api_schemas import Problem
from service.api.deps import warm_queue
from service.api.router import api_router
from service.api.routes.api_docs import install_api_docs
from service.api.routes.dashboard import router as dashboard_router
from service.api.routes.health import metrics_router
from service.errors import install_error_handlers
from service.middleware import (
    AdmissionMiddleware,
    BodyLimitMiddleware,
    ServerErrorGuard,
    long_transfer,
)
from service.nul_guard import NulGuardMiddleware
from service.planner import default_planner
from service.ratelimit import make_rate_limiter
from service.store.auth import KeyCache
from service.store.db.migrate import current_revision, head_revision
from service.store.db.session import make_engine, make_sessionmaker
from service.store.settings import Settings, get_settings
from service.telemetry import RequestMetricsMiddleware, Telemetry

__all__ = ["SchemaNotReady", "create_app"]

UPLOAD_ROUTES = (("POST", "/v1/datasets"), ("POST", "/v1/models"))


class SchemaNotReady(RuntimeError):
    """The database is unreachable or its schema is not at the expected Alembic revision."""


def _check_schema(engine: Engine) -> None:
    try:
        current = current_revision(engine)
    except Exception as err:  # noqa: BLE001 (report any connection failure clearly)
        raise SchemaNotReady(f"cannot reach the database {engine.url!r}: {err}") from err
    head = head_revision()
    if current != head:
        raise SchemaNotReady(
            f"database schema is at revision {current!r}, this code needs {head!r}: run the "
            f'migrations first (python -c "from service.store.db.migrate import upgrade; '
            f"upgrade('<database url>')\")"
        )


def _warm(app: FastAPI) -> None:
    """Start the planner children and import the queue client, off every request."""
    warm_queue()
    planner = getattr(app.state, "planner", None)  # a test may run the app without one
    if planner is not None:
        planner.warm()


def _unique_id(route: APIRoute) -> str:
    name = f"{route.tags[0]}-{route.name}" if route.tags else route.name
    return f"{name}-head" if route.methods == {"HEAD"} else name


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(
            settings.db_url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
        )
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        try:
            _check_schema(engine)
            settings.ensure_dirs()
            app.state.engine = engine
            app.state.sessionmaker = make_sessionmaker(engine)
            app.state.key_cache = KeyCache(
                ttl=settings.key_cache_seconds, miss_ttl=settings.key_miss_cache_seconds
            )
            app.state.rate_limiter = make_rate_limiter(settings)
            # the first submission must not pay for starting planners or importing the queue
            threading.Thread(target=_warm, args=(app,), name="comera-warm", daemon=True).start()
            yield
        finally:
            limiter = getattr(app.state, "rate_limiter", None)
            if limiter is not None:
                await limiter.aclose()
            engine.dispose()

    app = FastAPI(
        title="CoMERA compression service",
        version="1.0.0",
        lifespan=lifespan,
        docs_url=None,  # served offline instead (service.api.routes.api_docs)
        redoc_url=None,
        generate_unique_id_function=_unique_id,
        responses={500: {"model": Problem, "description": "Internal Server Error"}},
    )
    app.state.settings = settings
    app.state.planner = default_planner(settings.planner_processes)
    app.state.telemetry = Telemetry(lambda: app.state.sessionmaker())
    install_error_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        exempt=lambda method, path: (method, path.rstrip("/")) in UPLOAD_ROUTES,
    )
    app.add_middleware(AdmissionMiddleware, limit=settings.api_threads, exempt=long_transfer)
    app.add_middleware(NulGuardMiddleware)  # before any handler, query or store
    app.add_middleware(RequestMetricsMiddleware, telemetry=app.state.telemetry)
    app.add_middleware(ServerErrorGuard)  # outermost: a 500 never closes the connection
    app.include_router(api_router)
    app.include_router(metrics_router)
    app.include_router(dashboard_router)
    install_api_docs(app)
    return app
