"""A shutdown of the worker's main process preempts the job its pool child runs
(``worker.celery_app`` connects :func:`preempt_running_jobs` to ``worker_shutting_down``).

``docker stop``, systemd and ``comera up`` send SIGTERM to the worker's main process. Celery
takes it as a warm shutdown: no new messages, and the running task may finish. A training job
can take hours, longer than any grace period, so the SIGKILL that follows would lose the
attempt (the lease expires; the reaper requeues it from an older checkpoint:
docs/service.md#reaper). Instead, as soon as the main process starts shutting down, it
forwards SIGTERM to every pool child running ``comera.run_job``: there
:class:`worker.lease.Preemption` stops the trainer
at the next step, a ``partial`` checkpoint is written, the job goes back to QUEUED as attempt
n+1 with its message sent, and the task returns; the warm shutdown then ends at once.

A child that has not yet installed its handler (it is still claiming the job, well under a
second) dies on the signal instead; its job then takes the lost-lease path.

The main process goes on taking messages for up to two seconds after the signal (Celery's
loop drains the broker before it looks at its shutdown flag): the preempted job's own next
attempt, sent meanwhile, was one of them. Its task started in a fresh pool child, claimed the
job, and was killed by the pool's shutdown a moment later, leaving the job STARTING until its
lease expired (minutes later, and one attempt spent). So :func:`preempt_running_jobs` also
sets a flag shared with every pool child (:func:`shutting_down`), and a task that starts
while it is set sends its message back to its queue, untouched, for the next worker.
"""

from __future__ import annotations

import mmap
import os
import signal
from typing import Any

from celery.worker import state

__all__ = ["JOB_TASK", "preempt_running_jobs", "shutting_down"]

JOB_TASK = "comera.run_job"
# one byte of anonymous shared memory, mapped when the worker's main process imports this
# module, before its pool forks any child: children forked before or after the shutdown
# began read the byte the main process writes
_STOPPING = mmap.mmap(-1, 1)


def shutting_down() -> bool:
    """Whether this worker's main process has begun to shut down (in the main process or
    any of its pool children)."""
    return _STOPPING[0] == 1


def preempt_running_jobs(sig: str | None = None, how: str | None = None, **_: Any) -> list[int]:
    """SIGTERM to each pool child that runs a job; returns their pids. Runs in the main
    process's signal handler: only ``os.kill``, reads of Celery's request table and the
    shared flag's write."""
    _STOPPING[0] = 1
    pids = []
    for request in list(state.active_requests):
        pid = request.worker_pid
        if request.task_name != JOB_TASK or not pid or pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:  # it ended meanwhile
            continue
        pids.append(pid)
    return pids
