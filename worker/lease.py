"""The worker's hold on a job: the lease heartbeat and the trainer's ``should_stop`` poll.

:class:`Heartbeat` is a daemon thread that extends ``lease_expires_at`` every
``heartbeat_seconds`` while the lease is still ours (docs/service.md#claim-and-lease) and appends a
``heartbeat`` event with the current step and stage. When the conditional UPDATE matches no
row (the reaper gave the job to someone else, or it is terminal) the lease is lost and the
thread ends.

:class:`Stopper` is the trainer's ``should_stop``: cheap to call every step, it reads the job
row at most every ``poll_seconds`` and answers True, with a ``reason``, when

* ``cancel``: a cancel was requested (``cancel_requested_at`` set, or state CANCELLING);
* ``lost``: the lease is no longer ours (another owner, or a state we do not run in);
* ``deadline``: the job's wall-time limit is near (a clean stop with a checkpoint before
  Celery's soft time limit interrupts the step);
* ``preempted``: the process got SIGTERM (:class:`Preemption`: a cold worker shutdown, a
  node drain, the reaper's forced cancellation) and no cancel was requested.

The trainer then writes a partial checkpoint and returns.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobState
from service.store.db.crud.attempts import ACTIVE_STATES, extend_lease, stop_state
from service.store.db.crud.jobs import append_event
from service.store.db.session import session_scope

__all__ = ["ACTIVE_STATES", "Heartbeat", "Preemption", "Stopper"]

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(
        self,
        *,
        factory: sessionmaker[Session],
        job_id: str,
        attempt: int,
        owner: str,
        lease_seconds: float,
        interval: float,
        status: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        super().__init__(name=f"heartbeat-{job_id}", daemon=True)
        self.factory, self.job_id, self.attempt, self.owner = factory, job_id, attempt, owner
        self.lease_seconds, self.interval, self.status = lease_seconds, interval, status
        self.lost = False
        self.beats = 0
        self._stop_event = threading.Event()

    def beat(self) -> bool:
        with session_scope(self.factory) as s:
            if not extend_lease(
                session=s, job_id=self.job_id, owner=self.owner, lease_seconds=self.lease_seconds
            ):
                return False
            append_event(
                session=s,
                job_id=self.job_id,
                attempt=self.attempt,
                kind="heartbeat",
                data=self.status(),  # no worker name: tenants read events
            )
        self.beats += 1
        return True

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                if not self.beat():
                    self.lost = True
                    log.warning("job %s: lease lost by %s", self.job_id, self.owner)
                    return
            except Exception:  # a database hiccup: try again at the next beat
                log.exception("job %s: heartbeat failed", self.job_id)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=30)


class Preemption:
    """While installed (by the thread that runs the job: the process's main thread), SIGTERM
    only sets :attr:`event`, so the job stops at the next step with a checkpoint instead of
    dying mid-step. Elsewhere (another thread) it installs nothing and never fires."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()

    def install(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


class Stopper:
    """``should_stop`` for the trainer (see the module doc); ``reason`` says why it stopped."""

    def __init__(
        self,
        *,
        factory: sessionmaker[Session],
        job_id: str,
        owner: str,
        poll_seconds: float = 1.0,
        deadline: float | None = None,
        heartbeat: Heartbeat | None = None,
        preempted: threading.Event | None = None,
    ) -> None:
        self.factory, self.job_id, self.owner = factory, job_id, owner
        self.poll_seconds, self.deadline, self.heartbeat = poll_seconds, deadline, heartbeat
        self.preempted = preempted
        self.reason: str | None = None
        self._last_poll = -float("inf")

    def __call__(self) -> bool:
        if self.reason is not None:
            return True
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self.reason = "deadline"
        elif self.heartbeat is not None and self.heartbeat.lost:
            self.reason = "lost"
        elif self.preempted is not None and self.preempted.is_set():
            self.reason = self.poll() or "preempted"  # a requested cancel wins
        elif now - self._last_poll >= self.poll_seconds:
            self._last_poll = now
            self.reason = self.poll()
        return self.reason is not None

    def poll(self) -> str | None:
        try:
            with session_scope(self.factory) as s:
                row = stop_state(session=s, job_id=self.job_id)
        except Exception:  # a database hiccup must not stop training
            log.exception("job %s: cancellation poll failed", self.job_id)
            return None
        if row is None:
            return "lost"  # the job was deleted
        state, cancel_requested_at, lease_owner = row
        if state == JobState.CANCELLING.value or cancel_requested_at is not None:
            return "cancel"
        if lease_owner != self.owner or state not in ACTIVE_STATES:
            return "lost"
        return None
