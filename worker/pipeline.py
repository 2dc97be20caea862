"""One attempt of one job, start to finish: plain functions, tested without Celery.

:func:`run_job` is what the Celery task calls with ``(job_id, attempt)``:

1. **Claim** (docs/service.md#claim-and-lease): QUEUED -> STARTING for exactly this attempt,
   with our lease. Zero rows means a duplicate, stale or cancelled message: return
   ``"skipped"``, touch nothing.
2. **Prepare** (STARTING): resolve the dataset files (:mod:`worker.datasets`) and an
   ``hf_bert`` model directory against this worker's data root (:mod:`service.store.model_source`),
   translate the spec (``api_schemas.engine_spec.to_engine``), validate it
   (``JobConfig.from_dict``), plan it again with its real data (``worker.training.preflight``:
   the data's sizes and the memory estimate, as at submission) under a hard memory cap when
   run by the Celery task (``worker.memory_cap``: an allocation past it fails the job as
   ``oom``), and build the
   trainer, resuming from a checkpoint unless the job says ``scratch``: the one
   named by ``jobs.resume_from``, else the newest complete one of any attempt. Then
   STARTING -> RUNNING with the engine config and version.
3. **Train** (RUNNING): the engine's events go through :class:`worker.callback.JobCallback` to
   the batched :class:`worker.recorder.Recorder`; a heartbeat thread extends the lease; the
   trainer polls :class:`worker.lease.Stopper` for cancellation, lease loss and the deadline.
4. **Finish**: export the compressed model (atomic directory, a ``checkpoints`` row of kind
   ``export`` whose manifest carries the compression report) and SUCCEEDED; or CANCELLED
   after a cancel (the trainer left a partial checkpoint); or FAILED with a problem object
   (:mod:`worker.problems`). Every end closes the attempt row (``ended_at``, ``exit_reason``).
   Transitions are compare-and-set, so a terminal state is never overwritten; when the lease
   was lost the job belongs to someone else and is left alone (``"lost"``).
5. **Preemption**: SIGTERM while training (:class:`worker.lease.Preemption`) and no cancel:
   after the partial checkpoint the job goes back to QUEUED as attempt n+1 (resuming from
   it) and its message is sent at once (``"preempted"``; the reaper sends it if that fails);
   with no attempts left it is FAILED as ``preempted``.

A data-parallel job (``training.devices`` x ``training.nodes`` > 1) trains in processes of its
own (:mod:`worker.processes`: ``torchrun``, or a Ray Train driver across machines): steps 3 and
4 then follow its events file into the same callback, forward a stop through its stop file,
and register the export rank 0 wrote; the claim, lease, heartbeat, checkpoint choice and every
ending are the same.

Nothing here imports torch: :mod:`worker.training` (the engine-facing half) is imported once
the job is claimed, so a duplicate message is skipped without loading the engine.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobCreate, JobState
from api_schemas.engine_spec import SpecError
from service.store.db.crud.job_actions import end_attempt, mark_sent, requeue_job
from service.store.db.crud.jobs import append_event, get_job, transition
from service.store.db.models import Checkpoint, Job, JobAttempt, JobEvent, utcnow
from service.store.db.session import session_scope
from service.store.model_source import resolve_model_source
from service.store.settings import Settings
from worker.artifacts import (
    archive_dir,
    checkpoint_row,
    drop_partial,
    enforce_keep,
    find_checkpoint,
    sha256_file,
    workdir,
)
from worker.callback import JobCallback
from worker.datasets import resolve_dataset
from worker.lease import Heartbeat, Preemption, Stopper
from worker.memory_cap import MemoryCap, apply_cap
from worker.problems import JobTimeout, Preempted, problem_for
from worker.recorder import Recorder
from worker.report import (
    compression_report,
    compression_summary,
    success_message,
    val_metrics,
)

if TYPE_CHECKING:
    from engine.export import ExportInfo
    from engine.train import JobConfig, Trainer, TrainResult

__all__ = ["claim", "close_attempt", "deadline_for", "run_job", "worker_name"]

log = logging.getLogger(__name__)
S = JobState
T = TypeVar("T")
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

    def status(self) -> dict[str, Any]:
        p = self.recorder.progress
        out = {"step": p.get("step"), "stage": p.get("stage_name")}
        training = sys.modules.get("worker.training")  # loaded once the job is claimed
        gpu_memory = getattr(training, "gpu_memory", None)  # None while still importing
        memory = gpu_memory() if gpu_memory is not None else None
        if memory is not None:
            out["gpu_memory_bytes"] = memory
        return out


def claim(
    factory: sessionmaker[Session], *, job_id: str, attempt: int, owner: str, lease_seconds: float
) -> Job | None:
    """QUEUED -> STARTING for ``attempt`` with our lease, and the attempt row; None: lost."""
    now = utcnow()
    with session_scope(factory) as s:
        job = transition(
            session=s,
            job_id=job_id,
            from_states=[S.QUEUED],
            to_state=S.STARTING,
            attempt=attempt,
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            started_at=func.coalesce(Job.started_at, now),
            finished_at=None,
            error=None,
            enqueue_pending=False,
            message="preparing data and model",
        )
        if job is None:
            return None
        q = (
            update(JobAttempt)
            .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
            .values(worker=owner, started_at=now, ended_at=None, exit_reason=None)
        )
        if s.execute(q).rowcount == 0:
            s.add(
                JobAttempt(
                    job_id=job_id,
                    tenant_id=job.tenant_id,
                    attempt=attempt,
                    worker=owner,
                    started_at=now,
                )
            )
        return job


def close_attempt(session: Session, *, job_id: str, attempt: int, reason: str) -> None:
    """Set ``ended_at`` and ``exit_reason`` unless someone (the reaper) already closed it."""
    end_attempt(session=session, job_id=job_id, attempt=attempt, reason=reason)


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
    run = Attempt(
        settings,
        factory,
        job_id,
        attempt,
        owner,
        recorder,
        extra=list(callbacks),
        cap_memory=cap_memory,
    )
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
        return _fail(run, exc, job.spec)
    finally:
        run.lift_memory_cap()
        run.preemption.restore()
        heartbeat.stop()


def _run(
    run: Attempt, job: Job, heartbeat: Heartbeat, t0: float | None, deadline: float | None
) -> str:
    from worker import training

    settings = run.settings
    spec = JobCreate.model_validate(job.spec)
    with session_scope(run.factory) as s:
        train, valid = resolve_dataset(
            session=s, settings=settings, tenant_id=job.tenant_id, spec=spec.dataset
        )
        uploaded = (s, Path(settings.artifacts), job.tenant_id)  # the tenant's uploaded models
        model_dir = resolve_model_source(
            data_root=settings.data, model=spec.model, uploaded=uploaded
        )  # or None
    config, device = training.build_config(spec, train=train, valid=valid, model=model_dir)
    if run.cap_memory:
        run.memory_cap = apply_cap(settings.job_memory_cap)
    plan = training.preflight(config, spec, capacity_bytes=settings.worker_memory_bytes)
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
    if deadline is None and t0 is not None:
        deadline = deadline_for(spec.limits.max_wall_time_s, t0)
    stopper = Stopper(
        factory=run.factory,
        job_id=run.job_id,
        owner=run.owner,
        deadline=deadline,
        heartbeat=heartbeat,
        preempted=run.preemption.event,
    )
    if config.training.devices * config.training.nodes > 1:
        return _run_processes(run, job, config, device, plan, stopper)
    trainer, resumed = _trainer(run, job, config, stopper)
    run.recorder.set_progress(total_steps=training.total_steps(trainer, config))
    if not _start_running(run, job, config, device, resumed):  # cancelled while starting
        return _interrupted(run, stopper.poll() or "lost")
    result = trainer.run()
    run.recorder.flush()
    if result.status == "completed":
        return _succeed(run, job, trainer, result)
    return _stopped(run, job, stopper)


def _run_processes(
    run: Attempt, job: Job, config: JobConfig, device: str, plan: dict[str, Any], stopper: Stopper
) -> str:
    """Steps 3 and 4 of a data-parallel job, whose processes :mod:`worker.processes` starts
    and follows; the stop grace is ``COMERA_PROCESS_STOP_GRACE_SECONDS``, then SIGTERM and
    ``COMERA_CANCEL_KILL_AFTER_SECONDS`` later SIGKILL."""
    from worker import processes
    from worker.training import check_resumable

    settings = run.settings
    resume, resumed = _resume(run, job, lambda path: check_resumable(config, path))
    run.recorder.set_progress(total_steps=plan.get("total_steps"))
    world = processes.world_size(config)
    if not _start_running(run, job, config, device, resumed, world_size=world):
        return _interrupted(run, stopper.poll() or "lost")
    out = workdir(settings.artifacts, run.job_id, run.attempt)
    launch = processes.prepare(
        config,
        out=out,
        resume=resume,
        export_extra={"job_id": run.job_id, "attempt": run.attempt, "spec_hash": job.spec_hash},
    )
    log.info("job %s attempt %s: %d processes: %s", run.job_id, run.attempt, world, launch.command)
    outcome = processes.supervise(
        launch,
        callbacks=[run.callback, *run.extra],
        should_stop=stopper,
        grace=settings.process_stop_grace_seconds,
        kill_after=settings.cancel_kill_after_seconds,
    )
    run.recorder.flush()
    if outcome.completed and outcome.report is not None:
        info = processes.published_export(out)
        fidelity = outcome.report.get("fidelity")  # rank 0 measured it on the export
        return _register_export(run, job, outcome.report, info, fidelity, config.checkpoint.keep)
    if outcome.stopped:
        return _stopped(run, job, stopper)
    raise outcome.error()


def _start_running(
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

    with session_scope(run.factory) as s:
        running = transition(
            session=s,
            job_id=run.job_id,
            from_states=[S.STARTING],
            to_state=S.RUNNING,
            attempt=run.attempt,
            engine_config=config.to_dict(),
            engine_version=ENGINE_VERSION,
            message="running",
            event={"device": device, "resumed_from": resumed.id if resumed else None, **event},
        )
        if running is not None and resumed is not None:
            s.execute(
                update(JobAttempt)
                .where(JobAttempt.job_id == run.job_id, JobAttempt.attempt == run.attempt)
                .values(resume_from=resumed.id)
            )
        if running is not None:  # checkpointing.keep spans attempts: the older ones go
            _retain(s, run, job.tenant_id, config.checkpoint.keep, resumed)
    return running is not None


def _stopped(run: Attempt, job: Job, stopper: Stopper) -> str:
    """After a stop asked for by ``stopper``: the deadline, a preemption, a cancel, a lost
    lease."""
    if stopper.reason == "deadline":
        raise JobTimeout(
            f"stopped at step {run.recorder.progress.get('step')}, at the "
            "wall-time limit (limits.max_wall_time_s)"
        )
    if stopper.reason == "preempted":
        return _preempted(run, job)
    return _interrupted(run, stopper.reason or "lost")


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
    return _resume(run, job, lambda path: build_trainer(config, resume=path, **kwargs))


def _resume(
    run: Attempt, job: Job, start: Callable[[Path | None], T]
) -> tuple[T, Checkpoint | None]:
    """``start(path)`` from the chosen checkpoint (see the module doc), or ``start(None)``: the
    newest complete one that ``start`` does not refuse (``ResumeError``: from scratch, with a
    warning), or the one ``jobs.resume_from`` names (refused: a ``SpecError`` on ``/from``)."""
    from worker.training import ResumeError

    artifacts = run.settings.artifacts
    explicit = job.resume_from not in (None, "scratch", "latest_checkpoint")
    ckpt = None
    if job.resume_from != "scratch":
        with session_scope(run.factory) as s:
            ckpt = find_checkpoint(
                s,
                job_id=run.job_id,
                tenant_id=job.tenant_id,
                artifacts=artifacts,
                checkpoint_id=job.resume_from if explicit else None,
            )
        if explicit and ckpt is None:
            raise SpecError(
                "/from", f"{job.resume_from} is not an intact, resumable checkpoint of this job"
            )
    if ckpt is None:
        return start(None), None
    try:
        started = start(artifacts / ckpt.path)
    except ResumeError as exc:
        why = str(exc).replace(f"{artifacts}/", "")
        if explicit:
            raise SpecError("/from", f"{ckpt.id} cannot be resumed: {why}") from None
        message = f"checkpoint {ckpt.id} cannot be resumed ({why}); starting from scratch"
        run.recorder.event("log", {"level": "warning", "message": message})
        return start(None), None
    run.recorder.event(
        "log",
        {
            "level": "info",
            "message": f"resumed from checkpoint {ckpt.id} "
            f"(attempt {ckpt.attempt}, step {ckpt.step})",
        },
    )
    run.recorder.set_progress(step=ckpt.step)
    return started, ckpt


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
    return _register_export(run, job, result.report, info, fidelity, trainer.job.checkpoint.keep)


def _register_export(
    run: Attempt,
    job: Job,
    report: dict[str, Any],
    info: ExportInfo,
    fidelity: dict[str, Any] | None,
    keep: int,
) -> str:
    """The export's checkpoint row with its compression report (from the engine's ``report``),
    the job's compression summary, then SUCCEEDED."""
    stages = report["stages"]
    final = stages[-1]["metrics"] if stages else {}
    names = run.callback.names if run.callback else [None]
    row = checkpoint_row(
        path=info.weights_path,
        artifacts=run.settings.artifacts,
        job_id=run.job_id,
        tenant_id=job.tenant_id,
        attempt=run.attempt,
        kind="export",
        step=int(report["steps"]),
        stage=names[-1],
        metrics=val_metrics(final),
    )
    if row.sha256 != info.sha256:
        raise RuntimeError(f"the exported weights do not match their manifest ({row.sha256})")
    compression = compression_report(
        job_id=run.job_id,
        checkpoint_id=row.id,
        manifest=info.manifest,
        stages=stages,
        metrics=val_metrics(final),
        spec_hash=job.spec_hash,
        fidelity=fidelity,
        target=report.get("target"),
        chance=report.get("chance"),
        deploy=(report.get("hf_export") or {}).get("deploy"),
    )
    files = {
        info.weights_path.name: {"bytes": row.size_bytes, "sha256": row.sha256},
        info.manifest_path.name: {
            "bytes": info.manifest_path.stat().st_size,
            "sha256": sha256_file(info.manifest_path),
        },
    }
    row.manifest = {**info.manifest, "files": files, "report": compression}
    rec = run.recorder
    for r in [row, *_hf_dir_rows(run, job, info.path, row)]:
        rec.row(r)
        rec.event(
            "checkpoint",
            {
                "id": r.id,
                "kind": r.kind,
                "step": r.step,
                "stage": r.stage,
                "size_bytes": r.size_bytes,
                "sha256": r.sha256,
                "state": "complete",
            },
        )
    rec.set_compression(**compression_summary(compression))
    rec.set_progress(fraction=1.0)
    message = success_message(compression)
    outcome = ["succeeded"]

    def finish(s: Session) -> None:
        done = transition(
            session=s,
            job_id=run.job_id,
            from_states=[S.RUNNING],
            to_state=S.SUCCEEDED,
            attempt=run.attempt,
            message=message,
        )
        if done is not None:
            close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="completed")
            _retain(s, run, job.tenant_id, keep)
        else:  # a cancel arrived after the last step, or the lease was lost
            outcome[0] = _cancel(s, run, "cancelled after training completed")

    rec.flush(extra=finish)
    return outcome[0]


def _hf_dir_rows(run: Attempt, job: Job, export: Path, row: Checkpoint) -> list[Checkpoint]:
    """Rows of kind ``hf`` and ``dense`` for the Hugging Face directories an ``hf`` export
    holds, each archived to one tar (:func:`worker.artifacts.archive_dir`)."""
    rows = []
    for kind in ("hf", "dense"):
        if not (export / kind).is_dir():
            continue
        extra = checkpoint_row(
            path=archive_dir(export / kind),
            artifacts=run.settings.artifacts,
            job_id=run.job_id,
            tenant_id=job.tenant_id,
            attempt=run.attempt,
            kind=kind,
            step=row.step,
            stage=row.stage,
            metrics=row.metrics,
        )
        extra.format = "tar"
        rows.append(extra)
    return rows


def _retain(
    s: Session, run: Attempt, tenant_id: str, keep: int, resumed: Checkpoint | None = None
) -> None:
    """``checkpointing.keep`` across attempts (:func:`worker.artifacts.enforce_keep`): the
    ``keep`` newest resumable checkpoints of the job stay (and the one resumed from)."""
    for cid in enforce_keep(
        s,
        job_id=run.job_id,
        tenant_id=tenant_id,
        artifacts=run.settings.artifacts,
        keep=keep,
        protect=(resumed.id,) if resumed is not None else (),
    ):
        data = {"id": cid, "state": "deleted", "reason": "checkpointing.keep"}
        append_event(
            session=s, job_id=run.job_id, attempt=run.attempt, kind="checkpoint", data=data
        )


def _cancel(s: Session, run: Attempt, message: str) -> str:
    """CANCELLING (if not already) -> CANCELLED for our attempt; "lost" if it is not ours."""
    current = get_job(session=s, job_id=run.job_id)
    if current is not None and current.attempt == run.attempt:
        transition(
            session=s,
            job_id=run.job_id,
            from_states=[S.STARTING, S.RUNNING],
            to_state=S.CANCELLING,
            attempt=run.attempt,
        )
        current = transition(
            session=s,
            job_id=run.job_id,
            from_states=[S.CANCELLING],
            to_state=S.CANCELLED,
            attempt=run.attempt,
            message=message,
        ) or get_job(session=s, job_id=run.job_id)
    ours = current is not None and current.attempt == run.attempt
    cancelled = ours and current is not None and current.state == S.CANCELLED.value
    close_attempt(
        s,
        job_id=run.job_id,
        attempt=run.attempt,
        reason="cancelled" if cancelled else "worker_lost",
    )
    return "cancelled" if cancelled else "lost"


def _wants_partial(s: Session, job_id: str, tenant_id: str) -> bool:
    """The ``save_partial`` of the job's latest cancel request (default true)."""
    rows = s.scalars(
        select(JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.tenant_id == tenant_id)
        .order_by(JobEvent.seq.desc())
        .limit(50)
    )
    for data in rows:
        if isinstance(data, dict) and data.get("reason") == "cancel requested":
            return bool(data.get("save_partial", True))
    return True


def _interrupted(run: Attempt, reason: str) -> str:
    """After a cooperative stop: cancel -> CANCELLED; lease lost -> leave the job alone."""
    outcome = ["lost"]
    if reason == "cancel":
        ids = run.callback.checkpoints if run.callback else []
        step = run.recorder.progress.get("step")
        message = f"cancelled at step {step}" + (f"; partial checkpoint {ids[-1]}" if ids else "")

        def finish(s: Session) -> None:
            tenant_id = run.recorder.tenant_id
            if ids and not _wants_partial(s, run.job_id, tenant_id) and run.callback is not None:
                dropped = drop_partial(
                    s,
                    job_id=run.job_id,
                    tenant_id=tenant_id,
                    attempt=run.attempt,
                    artifacts=run.callback.artifacts,
                )
                for cid in dropped:
                    data = {"id": cid, "state": "deleted", "reason": "save_partial false"}
                    append_event(
                        session=s,
                        job_id=run.job_id,
                        attempt=run.attempt,
                        kind="checkpoint",
                        data=data,
                    )
            outcome[0] = _cancel(s, run, message)

        run.recorder.flush(extra=finish)
    else:
        log.warning("job %s attempt %s: lease lost; leaving the job", run.job_id, run.attempt)
        with session_scope(run.factory) as s:
            close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="worker_lost")
    return outcome[0]


def _preempted(run: Attempt, job: Job) -> str:
    """SIGTERM, no cancel: the partial checkpoint is written; requeue and send attempt n+1."""
    step = run.recorder.progress.get("step")
    if run.attempt >= job.max_attempts:
        raise Preempted(
            f"stopped by SIGTERM at step {step}; no attempts left (attempt "
            f"{run.attempt} of {job.max_attempts})"
        )
    moved: list[int] = []

    def finish(s: Session) -> None:
        current = get_job(session=s, job_id=run.job_id)
        if current is not None and current.attempt == run.attempt:
            back = requeue_job(
                session=s,
                job=current,
                from_states=[S.STARTING, S.RUNNING],
                reason="preempted",
                send_at=utcnow(),
                where=[Job.lease_owner == run.owner],
            )
            if back is not None:
                moved.append(back.attempt)
                return
        close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="worker_lost")

    run.recorder.flush(extra=finish)
    if not moved:
        return "lost"
    log.warning(
        "job %s attempt %s: preempted at step %s; attempt %s queued",
        run.job_id,
        run.attempt,
        step,
        moved[0],
    )
    from service.store.placement import placement
    from service.store.queue import enqueue  # a Celery client; the reaper sends it if this fails

    wall = int((job.spec.get("limits") or {}).get("max_wall_time_s") or 6 * 3600)
    if enqueue(
        settings=run.settings,
        job_id=run.job_id,
        attempt=moved[0],
        max_wall_time_s=wall,
        **placement(job.spec),
    ):
        with session_scope(run.factory) as s:
            mark_sent(session=s, job_id=run.job_id, attempt=moved[0], now=utcnow())
    return "preempted"


def _fail(run: Attempt, exc: Exception, spec: dict[str, Any] | None = None) -> str:
    """FAILED with the problem object of ``exc`` (never over a terminal state); ``spec``: the
    job's stored spec, which names the wire field of an engine error."""
    p = run.recorder.progress
    kind, problem = problem_for(
        exc,
        step=p.get("step"),
        stage=p.get("stage_name"),
        roots=(run.settings.data, run.settings.artifacts),
        spec=spec,
    )
    if kind == "error":
        log.exception("job %s attempt %s failed", run.job_id, run.attempt)
    else:
        log.warning(
            "job %s attempt %s failed (%s): %s", run.job_id, run.attempt, kind, problem["detail"]
        )
    try:  # keep what was measured up to the failure
        run.recorder.flush()
    except Exception:
        log.exception("job %s: could not flush the last points", run.job_id)
    with session_scope(run.factory) as s:
        transition(
            session=s,
            job_id=run.job_id,
            from_states=[S.STARTING, S.RUNNING, S.CANCELLING],
            to_state=S.FAILED,
            attempt=run.attempt,
            error=problem,
            message=f"{problem['title']}: {problem['detail']}",
        )
        close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason=kind)
    return "failed"
