"""One attempt of one job, start to finish: plain functions, tested without Celery.

:func:`run_job` is what the Celery task calls with ``(job_id, attempt)``:

1. **Claim** (docs/service.md#claim-and-lease): QUEUED -> STARTING for exactly this attempt,
   with our lease. Zero rows means a duplicate, stale or cancelled message: return
   ``"skipped"``, touch nothing.
2. **Prepare** (STARTING): read the engine config prepared once at submission
   (``service.store.prepare``; ``worker.training.load_config`` resolves only its root-relative
   paths again, under this worker's data root), plan it again with its real data
   (``worker.training.preflight``) under a hard memory cap when run by the Celery task
   (:mod:`worker.memory_cap`: an allocation past it fails the job as ``oom``), and build the
   trainer from the checkpoint :mod:`worker.resume` chooses. Then STARTING -> RUNNING (the
   stored config is kept; a job stored without one gets the config prepared here).
3. **Train** (RUNNING): the engine's events go through :class:`worker.callback.JobCallback` to
   the batched :class:`worker.recorder.Recorder`; a heartbeat thread extends the lease; the
   trainer polls :class:`worker.lease.Stopper` for cancellation, lease loss and the deadline.
4. **Finish** (:mod:`worker.endings`): export the compressed model (atomic directory, a
   ``checkpoints`` row of kind ``export`` whose manifest carries the compression report) and
   SUCCEEDED; or CANCELLED after a cancel (the trainer left a partial checkpoint); or, after
   SIGTERM (:class:`worker.lease.Preemption`) and no cancel, QUEUED again as attempt n+1
   (``"preempted"``); or FAILED with a problem object (:mod:`worker.problems`). Every end
   closes the attempt row; a job whose lease was lost is left alone (``"lost"``).

A data-parallel job (``training.devices`` x ``training.nodes`` > 1) runs steps 3 and 4 in
processes of its own (:mod:`worker.data_parallel`); the rest is the same.

Nothing here imports torch: :mod:`worker.training` (the engine-facing half) is imported once
the job is claimed, so a duplicate message is skipped without loading the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from api_schemas.jobs import LimitsSpec
from service.store.db.crud.attempts import claim_attempt
from service.store.db.models import Checkpoint, Job
from service.store.db.session import session_scope
from service.store.settings import Settings
from worker.artifacts import workdir
from worker.attempt import Attempt, deadline_for, start_running, worker_name
from worker.callback import JobCallback
from worker.data_parallel import run_processes
from worker.endings import close_attempt, fail, interrupted, stopped, succeed
from worker.lease import Heartbeat, Stopper
from worker.memory_cap import apply_cap
from worker.recorder import Recorder
from worker.resume import resume

if TYPE_CHECKING:
    from engine.train import JobConfig, Trainer, TrainResult

__all__ = ["claim", "close_attempt", "deadline_for", "run_job", "worker_name"]

log = logging.getLogger(__name__)


def claim(
    factory: sessionmaker[Session], *, job_id: str, attempt: int, owner: str, lease_seconds: float
) -> Job | None:
    """QUEUED -> STARTING for ``attempt`` with our lease, and the attempt row; None: lost."""
    with session_scope(factory) as s:
        return claim_attempt(
            session=s, job_id=job_id, attempt=attempt, owner=owner, lease_seconds=lease_seconds
        )


def run_job(
    *,
    job_id: str,
    attempt: int,
    settings: Settings,
    factory: sessionmaker[Session],
    deadline: float | None = None,
    callbacks: Iterable[Any] = (),
    cap_memory: bool = False,
) -> str:
    """Run one attempt; returns ``succeeded``, ``failed``, ``cancelled``, ``preempted``,
    ``skipped`` or ``lost``. ``deadline``: when to stop as ``timeout`` (``time.monotonic()``;
    default: from the spec's ``limits.max_wall_time_s``, see :func:`deadline_for`);
    ``callbacks``: more engine callbacks (observability, tests); ``cap_memory``: cap this
    process at ``settings.worker_memory_bytes`` above its size (only in a process of its own,
    as the Celery task's child is: the cap stays until the attempt ends)."""
    t0, owner = time.monotonic(), worker_name()
    job = claim(
        factory, job_id=job_id, attempt=attempt, owner=owner, lease_seconds=settings.lease_seconds
    )
    if job is None:
        log.info("job %s attempt %s: not claimable (duplicate or stale message)", job_id, attempt)
        return "skipped"
    recorder = Recorder(
        factory=factory,
        job_id=job_id,
        tenant_id=job.tenant_id,
        attempt=attempt,
        flush_seconds=settings.flush_seconds,
        flush_points=settings.flush_points,
    )
    run = Attempt(settings, factory, job_id, attempt, owner, recorder, cap_memory=cap_memory)
    run.extra = list(callbacks)
    heartbeat = Heartbeat(
        factory=factory,
        job_id=job_id,
        attempt=attempt,
        owner=owner,
        lease_seconds=settings.lease_seconds,
        interval=settings.heartbeat_seconds,
        status=run.status,
    )
    heartbeat.start()
    run.preemption.install()
    try:
        return _run(run, job, heartbeat, t0 if deadline is None else None, deadline)
    except Exception as exc:  # classified; BaseException (shutdown) is left to the reaper
        run.lift_memory_cap()
        return fail(run, exc, job.spec)
    finally:
        run.lift_memory_cap()
        run.preemption.restore()
        heartbeat.stop()


def _run(
    run: Attempt, job: Job, heartbeat: Heartbeat, t0: float | None, deadline: float | None
) -> str:
    """Steps 2 to 4 (see the module doc)."""
    from worker import training

    config, device, plan = _prepare(run, job)
    if deadline is None and t0 is not None:
        limits = LimitsSpec.model_validate(job.spec.get("limits", {}))
        deadline = deadline_for(limits.max_wall_time_s, t0)
    stopper = Stopper(
        factory=run.factory,
        job_id=run.job_id,
        owner=run.owner,
        deadline=deadline,
        heartbeat=heartbeat,
        preempted=run.preemption.event,
    )
    if config.training.devices * config.training.nodes > 1:
        return run_processes(run, job, config, device, plan, stopper)
    trainer, resumed = _trainer(run, job, config, stopper)
    run.recorder.set_progress(total_steps=training.total_steps(trainer, config))
    if not start_running(run, job, config, device, resumed):  # cancelled while starting
        return interrupted(run, stopper.poll() or "lost")
    result = trainer.run()
    run.recorder.flush()
    if result.status == "completed":
        return _succeed(run, job, trainer, result)
    return stopped(run, job, stopper)


def _prepare(run: Attempt, job: Job) -> tuple[JobConfig, str, dict[str, Any]]:
    """Step 2 up to the trainer: the engine config prepared at submission
    (``service.store.prepare``) with its root-relative paths resolved under this worker's roots,
    the device, and the plan (under the memory cap when asked); the job's callback is made."""
    from worker import training

    settings = run.settings
    with session_scope(run.factory) as s:  # the stored config, with this worker's paths
        config, device, _ = training.load_config(session=s, settings=settings, job=job)
    if run.cap_memory:
        run.memory_cap = apply_cap(settings.job_memory_cap)
    plan = training.preflight(config, job.spec, capacity_bytes=settings.worker_memory_bytes)
    cap = run.memory_cap
    run.recorder.event(
        "log",
        {
            "level": "info",
            "message": f"estimated memory {plan['estimated_memory_bytes']:,} bytes"
            + (f"; the process is capped at {cap.limit - cap.baseline:,} more" if cap else ""),
        },
    )
    names = [stage.label for stage in config.schedule]
    run.callback = JobCallback(
        recorder=run.recorder,
        stage_names=names,
        artifacts=settings.artifacts,
        tenant_id=job.tenant_id,
    )
    return config, device, plan


def _trainer(
    run: Attempt, job: Job, config: JobConfig, stopper: Stopper
) -> tuple[Trainer, Checkpoint | None]:
    """The trainer, resumed from the chosen checkpoint (see the module doc)."""
    from worker.training import build_trainer

    kwargs: dict[str, Any] = {
        "workdir": workdir(run.settings.artifacts, run.job_id, run.attempt),
        "callbacks": [run.callback, *run.extra],
        "should_stop": stopper,
    }
    return resume(run, job, lambda path: build_trainer(config, resume=path, **kwargs))


def _succeed(run: Attempt, job: Job, trainer: Trainer, result: TrainResult) -> str:
    """Export atomically, register the export with its report, then SUCCEEDED."""
    from worker.training import export_model, measure_fidelity

    out = workdir(run.settings.artifacts, run.job_id, run.attempt) / "export"
    info = export_model(
        trainer,
        result,
        out,
        {"job_id": run.job_id, "attempt": run.attempt, "spec_hash": job.spec_hash},
    )
    fidelity = measure_fidelity(trainer, out)
    if trainer.job.model.arch == "hf":  # model/hf/ (and model/dense/), as engine.train writes
        from engine.train.hf_outputs import hf_outputs

        result.report["hf_export"] = hf_outputs(trainer, out)
    return succeed(run, job, result.report, info, fidelity, trainer.job.checkpoint.keep)
