"""The reaper: jobs whose worker or message was lost get going again (docs/service.md#reaper).

:func:`reap_once` is one pass; ``comera up`` runs it in a thread (:class:`ReaperThread`),
``comera reaper`` in a loop, and deployments as the celery beat task ``comera.reap``. A pass
only reads the store, changes jobs by compare-and-set (each change with a ``job_events`` row)
and sends messages, so several reapers at once are safe: one wins each change, and a
duplicate message is a no-op at the worker's claim check.

1. **Lost workers.** A STARTING, RUNNING or CANCELLING job whose lease expired: the attempt
   is closed as ``worker_lost``. CANCELLING -> CANCELLED; else, with attempts left, QUEUED as
   attempt n+1, resuming from the newest complete checkpoint, sent after a backoff of
   ``retry_backoff_seconds`` x 2^(n-1) (at most ``retry_backoff_max_seconds``); else FAILED
   with a ``worker_lost`` problem.
2. **Forced cancellation.** A CANCELLING job past ``cancel_grace_seconds`` (at once when
   ``mode=immediate``): once the workers' remote control (a :class:`TaskControl`) confirms
   that its exact task id runs in the lease owner's process, that process gets SIGTERM (the
   worker checkpoints at the next step and stops), and SIGKILL ``cancel_kill_after_seconds``
   later; then CANCELLED.
3. **Unsent messages.** QUEUED jobs flagged ``enqueue_pending`` are sent: a requeue at its
   ``enqueued_at``, a failed submission ``redrive_after_seconds`` after it was flagged.
4. **Lost messages.** QUEUED jobs sent more than ``redeliver_after_seconds`` ago are sent
   again when the broker's queue of their placement (``service.store.placement``) holds fewer
   messages than there are jobs waiting for it (a broker restarted without persistence loses
   its queues).
5. **Expired idempotency keys** (kept 24 h) are deleted, at most ``PURGE_BATCH`` a pass, oldest
   first; it runs first, so a broker outage (which ends a pass early) never holds it up.

Nothing here imports torch or the worker package: the queue is reached by task name. The
store keeps only the remote control's interface (:class:`TaskControl`); the implementations
(Celery's broadcast, ``/proc`` for ``comera up``) are in ``service.task_control``, and each caller
passes the one its deployment needs (``comera up``, ``comera reaper``, the worker's beat task).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobState
from service.store.db.crud.idempotency import purge_expired
from service.store.db.crud.job_actions import end_attempt, mark_sent, requeue_job
from service.store.db.crud.jobs import append_event, transition
from service.store.db.crud.reaping import (
    cancels_due,
    expired_job_ids,
    queued_sent_before,
    queued_unsent,
    sigterm_sent_at,
    waiting_by_placement,
)
from service.store.db.models import Job, utcnow
from service.store.db.session import make_engine, make_sessionmaker, session_scope
from service.store.placement import placement, queue_name
from service.store.queue import client_app, enqueue, task_id
from service.store.settings import Settings

__all__ = [
    "PROBLEM_BASE",
    "PURGE_BATCH",
    "ReapReport",
    "ReaperThread",
    "TaskControl",
    "backoff_seconds",
    "queue_length",
    "reap_once",
]

log = logging.getLogger(__name__)
S = JobState
PROBLEM_BASE = "https://comera.dev/problems/"  # the same base as worker.problems
DEFAULT_WALL_TIME_S = 6 * 3600
PURGE_BATCH = 1000  # expired idempotency keys deleted per pass (a short transaction)

Send = Callable[..., bool]  # (job_id=, attempt=, max_wall_time_s=, devices=, nodes=) -> sent


class TaskControl(Protocol):
    """What forced cancellation (step 2) needs from the workers: their remote control
    (implemented in ``service.task_control``, passed in by the reaper's callers)."""

    def running(self, task: str, owner: str) -> bool | None:
        """Whether ``task`` runs in ``owner``'s process; None: no answer from its node."""

    def terminate(self, task: str, owner: str, sig: str) -> bool:
        """Send ``sig`` (``SIGTERM``/``SIGKILL``) to the process running ``task``."""


@dataclass
class ReapReport:
    """What one pass did (job ids per action)."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    signalled: list[tuple[str, str]] = field(default_factory=list)  # (job id, signal)
    sent: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    purged_keys: int = 0  # expired idempotency keys deleted

    def __bool__(self) -> bool:
        return any(self.counts().values())

    def counts(self) -> dict[str, int]:
        """What the pass did, counted (the beat task's result)."""
        return {k: v if isinstance(v, int) else len(v) for k, v in vars(self).items()}


def backoff_seconds(settings: Settings, attempt: int) -> float:
    """The wait before attempt ``attempt + 1`` runs after attempt ``attempt`` was lost."""
    base = settings.retry_backoff_seconds * 2 ** max(attempt - 1, 0)
    return float(min(base, settings.retry_backoff_max_seconds))


def queue_length(settings: Settings, queue: str | None = None) -> int | None:
    """Messages waiting in ``queue`` (default ``settings.queue``) on the broker; None if it
    cannot be asked."""
    try:
        with client_app(settings.broker).connection_for_write() as conn:
            name = queue or settings.queue
            return int(conn.default_channel.queue_declare(queue=name).message_count)
    except Exception as exc:  # noqa: BLE001 (any broker failure: unknown)
        log.warning("queue length unknown: %s: %s", type(exc).__name__, exc)
        return None


def _lost_problem(job: Job) -> dict[str, Any]:
    progress = job.progress or {}
    return {
        "type": PROBLEM_BASE + "worker_lost",
        "title": "The worker running the job was lost",
        "status": 503,
        "retryable": True,
        "stage": progress.get("stage_name"),
        "step": progress.get("step"),
        "detail": f"attempt {job.attempt} of {job.max_attempts}: the worker stopped "
        f"renewing its lease (crashed, killed or cut off) and no attempts are left",
    }


def _recover(s: Session, job: Job, now: datetime, settings: Settings, report: ReapReport) -> None:
    """Step 1 for one job whose lease expired (a compare-and-set on its lease)."""
    still_lost = [Job.lease_expires_at < now, Job.lease_owner == job.lease_owner]
    state, job_id, n = S(job.state), job.id, job.attempt

    def end(to_state: S, **values: Any) -> bool:
        """``to_state`` and the attempt closed, if the lease is still the lost one."""
        moved = transition(
            session=s,
            job_id=job_id,
            from_states=[state],
            to_state=to_state,
            version=job.version,
            attempt=n,
            where=still_lost,
            event={"reason": "worker_lost"},
            **values,
        )
        if moved is not None:
            end_attempt(session=s, job_id=job_id, attempt=n, reason="worker_lost")
        return moved is not None

    if state == S.CANCELLING:
        if end(S.CANCELLED, message="cancelled (its worker was lost)"):
            report.cancelled.append(job_id)
    elif n < job.max_attempts:
        delay = backoff_seconds(settings, n)
        if (
            requeue_job(
                session=s,
                job=job,
                from_states=[state],
                reason="worker_lost",
                send_at=now + timedelta(seconds=delay),
                where=still_lost,
                version=job.version,
            )
            is not None
        ):
            report.requeued.append(job_id)
    else:
        problem = _lost_problem(job)
        if end(S.FAILED, error=problem, message=f"{problem['title']}: {problem['detail']}"):
            report.failed.append(job_id)


def _force_cancel(
    factory: sessionmaker[Session],
    job: Job,
    now: datetime,
    settings: Settings,
    control: TaskControl,
    report: ReapReport,
) -> None:
    """Step 2 for one CANCELLING job past its grace period (or ``mode=immediate``)."""
    task, owner = task_id(job.id, job.attempt), job.lease_owner or ""
    with session_scope(factory) as s:
        sent_at = sigterm_sent_at(session=s, job=job)
    running = control.running(task, owner)
    if sent_at is None:
        if running and control.terminate(task, owner, "SIGTERM"):
            with session_scope(factory) as s:
                append_event(
                    session=s,
                    job_id=job.id,
                    attempt=job.attempt,
                    kind="log",
                    t=now,
                    data={
                        "level": "warning",
                        "signal": "SIGTERM",
                        "task_id": task,
                        "message": f"forced cancellation: SIGTERM to task {task}",
                    },
                )
            report.signalled.append((job.id, "SIGTERM"))
        return  # not running (or no answer): the lease decides (step 1)
    killed = False
    if running and (now - sent_at).total_seconds() >= settings.cancel_kill_after_seconds:
        killed = control.terminate(task, owner, "SIGKILL")
        if killed:
            report.signalled.append((job.id, "SIGKILL"))
    if running is False or killed:
        how = "killed (SIGKILL)" if killed else "stopped after SIGTERM"
        with session_scope(factory) as s:
            if (
                transition(
                    session=s,
                    job_id=job.id,
                    from_states=[S.CANCELLING],
                    to_state=S.CANCELLED,
                    version=job.version,
                    attempt=job.attempt,
                    event={"reason": "forced", "signal": "SIGKILL" if killed else "SIGTERM"},
                    message=f"cancelled: {how}",
                )
                is not None
            ):
                end_attempt(session=s, job_id=job.id, attempt=job.attempt, reason="cancelled")
                report.cancelled.append(job.id)


def _send(
    factory: sessionmaker[Session], job: Job, now: datetime, send: Send, note: str
) -> bool | None:
    """Send the job's message; stamp it (CAS on state and attempt). None: the broker failed."""
    limits = (job.spec or {}).get("limits") or {}
    wall = int(limits.get("max_wall_time_s") or DEFAULT_WALL_TIME_S)
    try:
        sent = bool(
            send(job_id=job.id, attempt=job.attempt, max_wall_time_s=wall, **placement(job.spec))
        )
    except Exception:  # noqa: BLE001 (any broker failure: not sent)
        log.exception("sending %s failed", job.id)
        sent = False
    if not sent:
        return None
    with session_scope(factory) as s:
        if not mark_sent(session=s, job_id=job.id, attempt=job.attempt, now=now):
            return False  # it moved on meanwhile; the duplicate is a no-op at the claim
        text = f"{note}: task {task_id(job.id, job.attempt)} sent by the reaper"
        append_event(
            session=s,
            job_id=job.id,
            attempt=job.attempt,
            kind="log",
            data={"level": "info", "message": text},
        )
    return True


def reap_once(
    *,
    factory: sessionmaker[Session],
    settings: Settings,
    control: TaskControl,
    now: datetime | None = None,
    send: Send | None = None,
    queue_size: Callable[[str], int | None] | None = None,
    purge_batch: int = PURGE_BATCH,
) -> ReapReport:
    """One pass of the five steps (see the module doc) as of ``now`` (default: the clock).

    ``control``: the workers' remote control for forced cancellation (``service.task_control``;
    None answers skip it); ``send``: how a message goes out (default
    ``service.store.queue.enqueue``); ``queue_size``: a broker queue's length, by name (default
    :func:`queue_length`); ``purge_batch``: expired idempotency keys deleted at most."""
    now = now or utcnow()
    send = send or partial(enqueue, settings=settings)
    report = ReapReport()
    with session_scope(factory) as s:
        report.purged_keys = purge_expired(session=s, now=now, limit=purge_batch)
    with session_scope(factory) as s:
        expired = expired_job_ids(session=s, now=now)
    for job_id in expired:
        with session_scope(factory) as s:
            job = s.get(Job, job_id)
            if job is not None and job.lease_expires_at is not None:
                _recover(s, job, now, settings, report)

    grace = now - timedelta(seconds=settings.cancel_grace_seconds)
    with session_scope(factory) as s:
        due = cancels_due(session=s, now=now, grace=grace)
    for job in due:
        _force_cancel(factory, job, now, settings, control, report)

    flagged = now - timedelta(seconds=settings.redrive_after_seconds)
    with session_scope(factory) as s:
        pending = queued_unsent(session=s, now=now, flagged=flagged)
    for job in pending:
        outcome = _send(factory, job, now, send, "message sent")
        if outcome is None:
            return report  # the broker is down: try again at the next pass
        if outcome:
            report.sent.append(job.id)

    old = now - timedelta(seconds=settings.redeliver_after_seconds)
    with session_scope(factory) as s:
        stale = queued_sent_before(session=s, before=old)
        waiting = _waiting(s, settings) if stale else {}
    size = queue_size or partial(queue_length, settings)
    sizes: dict[str, int | None] = {}
    for job in stale:
        queue = queue_name(settings.queue, **placement(job.spec))
        if queue not in sizes:
            sizes[queue] = size(queue)
        held = sizes[queue]
        if held is not None and held >= waiting.get(queue, 0):
            continue  # that queue holds a message for every job waiting for it
        outcome = _send(factory, job, now, send, "message lost; sent again")
        if outcome is None:
            break
        if outcome:
            report.resent.append(job.id)
    return report


def _waiting(s: Session, settings: Settings) -> dict[str, int]:
    """QUEUED jobs with a message sent, counted by the queue of their placement."""
    out: dict[str, int] = {}
    for d, n, count in waiting_by_placement(session=s):
        queue = queue_name(settings.queue, devices=int(d or 1), nodes=int(n or 1))
        out[queue] = out.get(queue, 0) + count
    return out


class ReaperThread(threading.Thread):
    """:func:`reap_once` every ``reaper_interval_seconds`` on its own engine, until
    :meth:`stop` (``comera up``, ``comera reaper``), with the workers' remote control
    ``control``. A failing pass is logged, not fatal."""

    def __init__(self, settings: Settings, *, control: TaskControl) -> None:
        super().__init__(name="comera-reaper", daemon=True)
        self.settings, self.control = settings, control
        self._stop_event = threading.Event()
        self.passes = 0

    def run(self) -> None:
        engine = make_engine(self.settings.db_url, pool_size=1, max_overflow=1)
        factory = make_sessionmaker(engine)
        try:
            while not self._stop_event.is_set():
                try:
                    report = reap_once(
                        factory=factory, settings=self.settings, control=self.control
                    )
                    if report:
                        log.info("reaper: %s", report)
                except Exception:  # a database or broker hiccup: try again next time
                    log.exception("reaper pass failed")
                self.passes += 1
                self._stop_event.wait(self.settings.reaper_interval_seconds)
        finally:
            engine.dispose()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=timeout)
