"""Sending work to the workers: a plain Celery client, no worker code and no torch.

The API commits the job row first, then calls :func:`enqueue`
(docs/service.md#outbox-re-drive). The message only says "try to run job X, attempt N" and is
sent by task *name*, so this module never imports ``worker``. Time limits go with each message:
soft = ``limits.max_wall_time_s`` (the worker checkpoints and fails the job as ``timeout``),
hard = soft + 900 s.

A broker that cannot be reached makes :func:`enqueue` return ``False`` within a few seconds,
never retry forever: the caller flags the job ``enqueue_pending`` and the reaper re-sends it.
A duplicate send is harmless (the worker's claim check turns it into a no-op).

A job goes to the queue of its placement (``service.store.placement``: ``gpu.any``, ``gpu.any.x2``,
...), which only workers that can run it consume.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import OperationalError

from service.store.placement import queue_name
from service.store.settings import Settings

__all__ = [
    "HARD_LIMIT_GRACE_S",
    "TASK_NAME",
    "client_app",
    "enqueue",
    "lost_table_race",
    "revoke",
    "task_id",
    "transport_options",
]

log = logging.getLogger(__name__)

TASK_NAME = "comera.run_job"
HARD_LIMIT_GRACE_S = 900
CONNECT_TIMEOUT_S = 2.0


def task_id(job_id: str, attempt: int) -> str:
    """Deterministic, so a duplicate send is visible in Flower and revoke can target it."""
    return f"{job_id}:{attempt}"


def transport_options(broker: str, *, client: bool) -> dict[str, Any]:
    """kombu transport options for ``broker`` (the worker app uses them too).

    Redis: the visibility timeout (docs/service.md#celery-settings). SQLAlchemy (``sqla+``,
    embedded mode): the options go to ``create_engine``, so only engine arguments. ``client``:
    connect with a short timeout and without retries, so an unreachable broker fails fast.
    """
    if broker.startswith(("redis://", "rediss://")):
        opts: dict[str, Any] = {"visibility_timeout": 3600}
        if client:
            opts.update(socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=CONNECT_TIMEOUT_S)
    elif broker.startswith("sqla+postgresql"):
        opts = {"pool_pre_ping": True}
        if client:
            opts["connect_args"] = {"connect_timeout": int(CONNECT_TIMEOUT_S)}
    elif broker.startswith("sqla+sqlite"):
        opts = {"connect_args": {"timeout": 30}}
    else:
        opts = {}
    if client:
        opts["max_retries"] = 0  # kombu: fail the first connect instead of retrying forever
    return opts


@lru_cache(maxsize=8)
def client_app(broker: str) -> Celery:
    """A sender-only Celery app for ``broker`` (cached: one producer pool per process)."""
    app = Celery("comera-client", broker=broker, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_send_sent_event=True,
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        broker_connection_timeout=CONNECT_TIMEOUT_S,
        broker_transport_options=transport_options(broker, client=True),
    )
    return app


def enqueue(
    *,
    settings: Settings,
    job_id: str,
    attempt: int,
    max_wall_time_s: int,
    devices: int = 1,
    nodes: int = 1,
) -> bool:
    """Send ``comera.run_job(job_id, attempt)`` to the queue of its placement (``devices`` per
    node, ``nodes``: ``service.store.placement.queue_name``); False if the broker is
    unreachable (nothing is retried here)."""
    app = client_app(settings.broker)
    for first in (True, False):
        try:
            app.send_task(
                TASK_NAME,
                args=(job_id, attempt),
                task_id=task_id(job_id, attempt),
                queue=queue_name(settings.queue, devices=devices, nodes=nodes),
                soft_time_limit=max_wall_time_s,
                time_limit=max_wall_time_s + HARD_LIMIT_GRACE_S,
                retry=False,
            )
            return True
        except Exception as exc:  # noqa: BLE001 (any broker failure means: not sent)
            if first and lost_table_race(exc):
                continue  # the other process made the tables: the second send finds them
            log.warning(
                "enqueue of %s failed: %s: %s", task_id(job_id, attempt), type(exc).__name__, exc
            )
            return False
    return False


def lost_table_race(exc: BaseException) -> bool:
    """Whether ``exc`` is an SQLAlchemy broker's lost race to create its tables.

    kombu's SQLAlchemy transport creates its two tables on a process's first connection,
    checking first and then creating: when two processes connect to a new broker at once (in
    the embedded mode, the API's first send while a worker boots) one of them gets "table
    kombu_queue already exists". The tables exist then, so sending again succeeds; the worker's
    own connection retries by itself (``broker_connection_retry_on_startup``)."""
    # kombu re-raises the database's error as its own OperationalError
    return isinstance(exc, OperationalError | BrokerError) and "already exists" in str(exc)


def revoke(settings: Settings, task_id: str) -> bool:
    """Revoke a queued task without terminating anything (the claim check is the real guard);
    False if the broadcast could not be sent."""
    try:
        client_app(settings.broker).control.revoke(task_id)
    except Exception as exc:  # noqa: BLE001
        log.warning("revoke of %s failed: %s: %s", task_id, type(exc).__name__, exc)
        return False
    return True
