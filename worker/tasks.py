"""The Celery tasks: ``comera.run_job(job_id, attempt)``, a thin shell over the pipeline, and
``comera.reap``, one pass of the reaper (``service.store.reaper``; celery beat sends it).

It re-reads everything from the database (the message carries only ids), and it is
idempotent: a duplicate or stale message loses the claim and returns ``"skipped"``. Acks are
early (worker.celery_app).

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

import time
from typing import Any

from sqlalchemy.exc import OperationalError

from service.store.reaper import reap_once
from service.store.settings import get_settings
from worker import pipeline
from worker.celery_app import app, session_factory

__all__ = ["reap", "run_job"]


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
def run_job(self: Any, job_id: str, attempt: int) -> str:
    soft = (self.request.timelimit or (None, None))[1]
    deadline = pipeline.deadline_for(soft, time.monotonic()) if soft else None
    return pipeline.run_job(
        job_id=job_id,
        attempt=attempt,
        settings=get_settings(),
        factory=session_factory(),
        deadline=deadline,
        cap_memory=True,  # this child runs one job and exits (worker_max_tasks_per_child)
    )


@app.task(name="comera.reap", ignore_result=True, acks_late=False)
def reap() -> dict[str, int]:
    """One reaper pass; what it did, counted (the worker logs it)."""
    report = reap_once(factory=session_factory(), settings=get_settings())
    return report.counts()
