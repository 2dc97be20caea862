"""One claimed attempt of a job, as the pipeline, its data-parallel path and its endings
share it.

:class:`Attempt` holds what every step after the claim writes through: the settings, the
session factory, the job and attempt ids, the lease owner, the batched
:class:`worker.recorder.Recorder`, the engine callback once the trainer is built, the SIGTERM
handler (:class:`worker.lease.Preemption`) and the memory cap of the Celery task's child.
:func:`start_running` moves the prepared attempt from STARTING to RUNNING. :func:`worker_name`
is the lease owner (``host:pid``); :func:`deadline_for` the clean stop before a wall-time
limit.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobState
from service.store.db.crud.attempts import set_resume_from
from service.store.db.crud.jobs import transition
from service.store.db.models import Checkpoint, Job
from service.store.db.session import session_scope
from service.store.prepare import is_prepared
from service.store.settings import Settings
from worker.artifacts import retain
from worker.callback import JobCallback
from worker.lease import Preemption
from worker.memory_cap import MemoryCap
from worker.recorder import Recorder

if TYPE_CHECKING:
    from engine.train import JobConfig

__all__ = ["DEADLINE_MARGIN_S", "Attempt", "deadline_for", "start_running", "worker_name"]

DEADLINE_MARGIN_S = 60.0  # stop cleanly this long before the wall-time limit (at most 10 %)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def deadline_for(wall_time_s: float, started: float) -> float:
    """The ``time.monotonic()`` at which to stop cleanly, a little before ``wall_time_s``
    (counted from ``started``) runs out: time to write a checkpoint before a hard stop."""
    return started + wall_time_s - min(DEADLINE_MARGIN_S, 0.1 * wall_time_s)


@dataclass
class Attempt:
    """One claimed attempt and what it writes through."""

    settings: Settings
    factory: sessionmaker[Session]
    job_id: str
    attempt: int
    owner: str
    recorder: Recorder
    callback: JobCallback | None = None
    preemption: Preemption = field(default_factory=Preemption)
    extra: list[Any] = field(default_factory=list)  # more engine callbacks
    cap_memory: bool = False  # run under worker.memory_cap (the Celery task's fresh child)
    memory_cap: MemoryCap | None = None

    def lift_memory_cap(self) -> None:
        """Back to the limit the process had (to record a failure with room to spare)."""
        cap, self.memory_cap = self.memory_cap, None
        if cap is not None:
            cap.restore()

    def move(
        self, s: Session, from_states: Iterable[JobState], to_state: JobState, **values: Any
    ) -> Job | None:
        """Compare-and-set this attempt's job from one of ``from_states`` to ``to_state``
        (:func:`~service.store.db.crud.jobs.transition`: ``values`` are the other columns and
        the ``event``); None when the job was in none of them or is on another attempt."""
        return transition(
            session=s,
            job_id=self.job_id,
            from_states=from_states,
            to_state=to_state,
            attempt=self.attempt,
            **values,
        )

    def retain(
        self, s: Session, *, tenant_id: str, keep: int, protect: tuple[str, ...] = ()
    ) -> None:
        """:func:`worker.artifacts.retain` for this attempt: the job's ``keep`` newest
        resumable checkpoints (and ``protect``) stay."""
        retain(
            s,
            job_id=self.job_id,
            tenant_id=tenant_id,
            attempt=self.attempt,
            artifacts=self.settings.artifacts,
            keep=keep,
            protect=protect,
        )

    def status(self) -> dict[str, Any]:
        p = self.recorder.progress
        out = {"step": p.get("step"), "stage": p.get("stage_name")}
        training = sys.modules.get("worker.training")  # loaded once the job is claimed
        gpu_memory = getattr(training, "gpu_memory", None)  # None while still importing
        memory = gpu_memory() if gpu_memory is not None else None
        if memory is not None:
            out["gpu_memory_bytes"] = memory
        return out


def start_running(
    run: Attempt,
    job: Job,
    config: JobConfig,
    device: str,
    resumed: Checkpoint | None,
    **event: Any,
) -> bool:
    """STARTING -> RUNNING with the engine config (the ``resume_from`` of the attempt, the
    older checkpoints past ``checkpointing.keep`` dropped); False: cancelled or taken away."""
    from worker.training import ENGINE_VERSION

    # the config prepared at submission stays as stored; one the worker prepared is kept
    stored = {} if is_prepared(job.engine_config) else {"engine_config": config.to_dict()}
    with session_scope(run.factory) as s:
        running = run.move(
            s,
            [JobState.STARTING],
            JobState.RUNNING,
            engine_version=ENGINE_VERSION,
            message="running",
            event={"device": device, "resumed_from": resumed.id if resumed else None, **event},
            **stored,
        )
        if running is not None and resumed is not None:
            set_resume_from(
                session=s, job_id=run.job_id, attempt=run.attempt, checkpoint_id=resumed.id
            )
        if running is not None:  # checkpointing.keep spans attempts: the older ones go
            run.retain(
                s,
                tenant_id=job.tenant_id,
                keep=config.checkpoint.keep,
                protect=(resumed.id,) if resumed is not None else (),
            )
    return running is not None
