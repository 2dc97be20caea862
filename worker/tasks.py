"""The Celery tasks: ``comera.run_job(job_id, attempt)``, a thin shell over the pipeline, and
``comera.reap``, one pass of the reaper (``service.store.reaper``; celery beat sends it), with
the broker-wide remote control (``service.task_control.CeleryControl``) for forced cancellation.

It re-reads everything from the database (the message carries only ids), and it is
idempotent: a duplicate or stale message loses the claim and returns ``"skipped"``. Acks are
early (worker.celery_app).

A message taken while this worker shuts down (``worker.shutdown.shutting_down``) goes back to
the end of its queue, unchanged, and returns ``"handed back"``: the job is not claimed by a
process about to be stopped.

Tenants take turns (docs/service.md#scheduling-order): when another tenant's turn comes
first (``service.store.db.crud.fair_queue``), the message goes back to the end of its queue,
unchanged but for a ``deferred`` count, and the task returns ``"deferred"``; the turn's own
message gets there first. A message already sent back once for every job waiting in its queue
runs its job regardless (the turn's message may be lost or held by a busy worker).

A database that cannot be reached (``OperationalError``) before the claim would leave a
QUEUED job without a message, so the task is retried, with exponential backoff and jitter (at
most 5 times, at most 600 s apart; docs/service.md#failure-classes). Once a job is claimed,
failures are the job's (FAILED) or the reaper's (an expired lease): a retried message then
loses the claim.

Time limits come with each message (``service.store.queue.enqueue``): the pipeline stops cleanly,
with a checkpoint, a little before the soft limit, which stays the backstop. Torch is
imported only once a job is claimed, in the child process that runs it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.store.db.crud.fair_queue import next_tenant
from service.store.db.session import session_scope
from service.store.placement import queue_name
from service.store.queue import TASK_NAME, client_app, task_id
from service.store.reaper import reap_once
from service.store.settings import Settings, get_settings
from service.task_control import CeleryControl
from worker import pipeline
from worker.celery_app import app, session_factory
from worker.shutdown import shutting_down

__all__ = ["reap", "run_job"]

log = logging.getLogger(__name__)


@app.task(
    name="comera.run_job",
    bind=True,
    ignore_result=True,
    acks_late=False,
    autoretry_for=(OperationalError,),
    max_retries=5,
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
)
def run_job(self: Any, job_id: str, attempt: int, deferred: int = 0) -> str:
    settings, factory = get_settings(), session_factory()
    if shutting_down():  # taken in the last moments of this worker's loop: not for it
        return _hand_back(
            self, settings, factory, job_id=job_id, attempt=attempt, deferred=deferred
        )
    if _send_back(self, settings, factory, job_id=job_id, attempt=attempt, deferred=deferred):
        return "deferred"
    soft = (self.request.timelimit or (None, None))[1]
    deadline = pipeline.deadline_for(soft, time.monotonic()) if soft else None
    return pipeline.run_job(
        job_id=job_id,
        attempt=attempt,
        settings=settings,
        factory=factory,
        deadline=deadline,
        cap_memory=True,  # this child runs one job and exits (worker_max_tasks_per_child)
    )


def _send_back(
    task: Any,
    settings: Settings,
    factory: sessionmaker[Session],
    *,
    job_id: str,
    attempt: int,
    deferred: int,
) -> bool:
    """Another tenant's turn: send this message again, to the end of its queue, with the same
    id and time limits; False (run it now) when it is its tenant's turn, when it was sent back
    once for every waiting job already, or when the broker refuses it."""
    with session_scope(factory) as s:
        decision = next_tenant(session=s, job_id=job_id, attempt=attempt)
    if decision.its_turn or deferred >= decision.waiting:
        return False
    queue = queue_name(settings.queue, devices=decision.devices, nodes=decision.nodes)
    try:
        _resend(task, settings, queue, job_id=job_id, attempt=attempt, deferred=deferred + 1)
    except Exception as exc:  # noqa: BLE001 (any broker failure: run it now instead)
        log.warning("job %s: could not send its message back (%s); running it", job_id, exc)
        return False
    log.info(
        "job %s attempt %s: tenant %s's turn first; message sent back (%d)",
        job_id,
        attempt,
        decision.turn,
        deferred + 1,
    )
    return True


def _hand_back(
    task: Any,
    settings: Settings,
    factory: sessionmaker[Session],
    *,
    job_id: str,
    attempt: int,
    deferred: int,
) -> str:
    """This worker is shutting down (``worker.shutdown``): the message of a job waiting for
    this attempt goes back to the end of its queue, untouched, and the job is not claimed;
    a stale or duplicate message is dropped as the claim would drop it."""
    with session_scope(factory) as s:
        decision = next_tenant(session=s, job_id=job_id, attempt=attempt)
    if decision.tenant_id is None:  # gone, no longer QUEUED, or at another attempt
        return "skipped"
    queue = queue_name(settings.queue, devices=decision.devices, nodes=decision.nodes)
    try:
        _resend(task, settings, queue, job_id=job_id, attempt=attempt, deferred=deferred)
    except Exception as exc:  # noqa: BLE001 (the reaper re-sends a lost message)
        log.warning(
            "job %s attempt %s: this worker is stopping and could not send its "
            "message back (%s); the reaper will",
            job_id,
            attempt,
            exc,
        )
        return "lost"
    log.info("job %s attempt %s: this worker is stopping; message sent back", job_id, attempt)
    return "handed back"


def _resend(
    task: Any, settings: Settings, queue: str, *, job_id: str, attempt: int, deferred: int
) -> None:
    """This message again, to the end of ``queue``: the same id and time limits."""
    hard, soft = task.request.timelimit or (None, None)
    client_app(settings.broker).send_task(
        TASK_NAME,
        args=(job_id, attempt),
        kwargs={"deferred": deferred},
        task_id=task.request.id or task_id(job_id, attempt),
        queue=queue,
        soft_time_limit=soft,
        time_limit=hard,
        retry=False,
    )


@app.task(name="comera.reap", ignore_result=True, acks_late=False)
def reap() -> dict[str, int]:
    """One reaper pass; what it did, counted (the worker logs it)."""
    settings = get_settings()
    report = reap_once(
        factory=session_factory(), settings=settings, control=CeleryControl(settings)
    )
    return report.counts()
