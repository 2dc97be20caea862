"""The worker's row in the store (``service.store.workers``): what it can run, while it runs.

``worker.celery_app`` starts :class:`Registration` in the main process when the Celery worker
is ready: a daemon thread that writes the row (the node name and the job queues it consumes)
at once and refreshes it every ``COMERA_HEARTBEAT_SECONDS`` until the worker shuts down. The
API then refuses a job whose placement no registered worker serves, and a job that waited
``waiting_for_capacity`` gets its ``queued`` message back when a worker for it registers.

After its first beat a second thread measures this host's per-process memory baseline once
(:func:`worker.process_baseline.host_baseline`, child processes, a few seconds the first time
after the host started) and exports it to the pool's children forked after that
(``COMERA_PROCESS_BASELINE``), whose plans count it (:mod:`worker.memory_estimate`); the
beats after it write it into the row, where the API's planner reads it.

The main process forks the pool's children, so it holds no database connection between two
refreshes (the engine's pool is disposed after each). The row stays after a shutdown: a
restarted worker keeps its placement known; one gone for ``COMERA_WORKER_TTL_SECONDS`` no
longer counts.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from service.store.db.session import make_engine, make_sessionmaker
from service.store.settings import Settings, get_settings
from service.store.workers import register_worker
from worker.process_baseline import ENV, ProcessBaseline, host_baseline

__all__ = ["Registration", "start_registration", "stop_registration"]

log = logging.getLogger(__name__)


class Registration(threading.Thread):
    """Writes and refreshes the row of worker ``name`` consuming ``queues``."""

    def __init__(self, settings: Settings, name: str, queues: list[str]) -> None:
        super().__init__(name="comera-registration", daemon=True)
        self.settings, self.worker_name, self.queues = settings, name, queues
        self.stopped = threading.Event()
        self.beats = 0
        self.baseline: ProcessBaseline | None = None
        self.baseline_tried = False

    def beat(self) -> None:
        engine = make_engine(self.settings.db_url, pool_size=1, max_overflow=0)
        try:
            with make_sessionmaker(engine)() as session:
                released = register_worker(
                    session=session,
                    settings=self.settings,
                    name=self.worker_name,
                    queues=self.queues,
                    baseline=None if self.baseline is None else self.baseline.to_dict(),
                )
        finally:
            engine.dispose()  # no connection outlives the beat (the pool's children fork)
        if released:
            log.info("%d job(s) waiting for capacity are queued for this worker", released)
        self.beats += 1

    def measure_baseline(self) -> None:
        """This host's per-process baseline, exported to the children forked from now on."""
        self.baseline_tried = True
        try:
            baseline = host_baseline()
        except (RuntimeError, OSError, ValueError) as err:  # the plans keep the default
            log.warning("worker %s: no process baseline measured: %s", self.worker_name, err)
            return
        os.environ[ENV] = json.dumps(baseline.to_dict())
        self.baseline = baseline
        log.info(
            "worker %s: a job's process holds %d MB before its model (%d MB more for hf), "
            "torchrun's launcher %d MB",
            self.worker_name,
            baseline.process_bytes >> 20,
            baseline.hf_bytes >> 20,
            baseline.launcher_bytes >> 20,
        )

    def run(self) -> None:
        while True:
            try:
                self.beat()
            except Exception:  # noqa: BLE001 (a store outage: try again next beat)
                log.exception("worker %s: registration failed", self.worker_name)
            if not self.baseline_tried:  # beside the beats, which it must not hold up
                self.baseline_tried = True
                threading.Thread(target=self.measure_baseline, daemon=True).start()
            if self.stopped.wait(self.settings.heartbeat_seconds):
                return

    def stop(self) -> None:
        self.stopped.set()


_running: dict[str, Registration] = {}


def start_registration(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` handler: ``sender`` is the worker's consumer (its node name and app)."""
    if sender is None or "thread" in _running:
        return
    queues = list(sender.app.amqp.queues.consume_from or {})
    thread = Registration(get_settings(), sender.hostname, queues)
    _running["thread"] = thread
    thread.start()


def stop_registration(**_: Any) -> None:
    """``worker_shutting_down`` handler: no more refreshes (the row stays)."""
    thread = _running.pop("thread", None)
    if thread is not None:
        thread.stop()
