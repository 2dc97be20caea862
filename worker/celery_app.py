"""The worker's Celery app, configured as docs/service.md#celery-settings says.

Ack early (``task_acks_late=False``) and never prefetch: a Celery message only says "try job
X, attempt N"; duplicates and lost messages are handled by the claim check and the reaper, so
a redelivered hour-long job never runs twice. One job per process (``prefork``, concurrency 1,
a fresh child per task: all GPU memory returns and CUDA state resets). Results live in SQL,
so there is no result backend.

The database engine is created in each child after fork (``worker_process_init``): a
connection pool must never be shared across processes. This module imports no torch; the
parent process never touches CUDA.

When ready, the main process registers the worker in the store and refreshes its row while it
runs (``worker.registration``): the API refuses jobs no registered worker can run.

A shutdown of the main process (SIGTERM from ``docker stop``) forwards SIGTERM to the pool
child running a job, which checkpoints and requeues it (``worker.shutdown``) instead of
training on to its end under Celery's warm shutdown.

The reaper (``service.store.reaper``) runs as the beat task ``comera.reap`` every
``reaper_interval_seconds``, routed to ``maintenance_queue``: a GPU worker runs one job at a
time, so a reap message in its queue would wait behind hours of training. One small worker
with embedded beat consumes that queue (``docker-compose.yml``, service ``beat``)::

    celery -A worker.celery_app worker --beat --pool solo -Q comera.maintenance

Run::

    COMERA_DATABASE_URL=... COMERA_BROKER_URL=... \\
        celery -A worker.celery_app worker --pool prefork -c 1 -Q gpu.any
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutting_down,
)
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.store.db.migrate import current_revision, head_revision
from service.store.db.session import make_engine, make_sessionmaker
from service.store.queue import transport_options
from service.store.settings import Settings, get_settings
from worker.registration import start_registration, stop_registration
from worker.shutdown import preempt_running_jobs

__all__ = ["app", "check_schema", "make_celery", "session_factory"]

log = logging.getLogger(__name__)


def make_celery(settings: Settings) -> Celery:
    """The worker app for ``settings`` (broker, queue); tasks come from ``worker.tasks``."""
    app = Celery("comera", broker=settings.broker, include=["worker.tasks"])
    redis = settings.broker.startswith(("redis://", "rediss://"))
    # a reap pass that waited longer than an interval is superseded by the next one
    every = settings.reaper_interval_seconds
    reap = {
        "task": "comera.reap",
        "schedule": every,
        "options": {"queue": settings.maintenance_queue, "expires": every},
    }
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        # Celery >= 5.6 and Redis only (it warns and ignores the flag on other transports)
        worker_disable_prefetch=redis,
        worker_concurrency=1,
        worker_pool="prefork",
        worker_max_tasks_per_child=1,
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        result_backend=None,
        task_track_started=False,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_soft_shutdown_timeout=60.0,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport_options(settings.broker, client=False),
        task_default_queue=settings.queue,
        task_create_missing_queues=True,
        task_routes={"comera.reap": {"queue": settings.maintenance_queue}},
        beat_schedule={"comera-reap": reap},
    )
    return app


app = make_celery(get_settings())

_process: dict[str, Any] = {}  # this process's engine and sessionmaker (set after fork)


def session_factory() -> sessionmaker[Session]:
    """This process's sessionmaker; created on first use if ``worker_process_init`` did not run
    (the ``solo`` pool, or a call outside a worker)."""
    if "factory" not in _process:
        _open_database()
    return _process["factory"]


def _open_database(**_: Any) -> None:
    engine = make_engine(get_settings().db_url)
    _process.update(engine=engine, factory=make_sessionmaker(engine))


def _close_database(**_: Any) -> None:
    engine: Engine | None = _process.pop("engine", None)
    _process.pop("factory", None)
    if engine is not None:
        engine.dispose()


def check_schema(url: str) -> None:
    """Refuse to start against a database whose schema is not at this code's migration head."""
    engine = make_engine(url)
    try:
        current, head = current_revision(engine), head_revision()
    finally:
        engine.dispose()  # the parent keeps no pool: children open their own after fork
    if current != head:
        raise SystemExit(
            f"database schema is at revision {current!r}, this worker needs "
            f"{head!r}: run the migrations first"
        )


def _check_schema_on_start(**_: Any) -> None:
    check_schema(get_settings().db_url)


worker_init.connect(_check_schema_on_start, weak=False)
worker_process_init.connect(_open_database, weak=False)
worker_process_shutdown.connect(_close_database, weak=False)
# SIGTERM (or Ctrl-C) to the main process: the running job checkpoints and is requeued
worker_shutting_down.connect(preempt_running_jobs, weak=False)
# the worker's row in the store: what it can run, refreshed while it runs (worker.registration)
worker_ready.connect(start_registration, weak=False)
worker_shutting_down.connect(stop_registration, weak=False)
