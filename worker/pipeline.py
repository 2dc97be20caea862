"""One attempt of one job, start to finish: plain functions, tested without Celery.

:func:`run_job` is what the Celery task calls with ``(job_id, attempt)``:

1. **Claim** (service-design c.2): QUEUED -> STARTING for exactly this attempt, with our lease.
   Zero rows means a duplicate, stale or cancelled message: return ``"skipped"``, touch nothing.
2. **Prepare** (STARTING): resolve the dataset files (:mod:`worker.datasets`) and an
   ``hf_bert`` model directory against this worker's data root (:mod:`service.model_source`),
   translate the spec (``service.spec.to_engine``), validate it (``JobConfig.from_dict``),
   and build the trainer, resuming from a checkpoint unless the job says ``scratch``: the one
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

Nothing here imports torch: :mod:`worker.training` (the engine-facing half) is imported once
the job is claimed, so a duplicate message is skipped without loading the engine.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobCreate, JobState
from service.core.config import Settings
from service.db.crud.job_actions import end_attempt, mark_sent, requeue_job
from service.db.crud.jobs import append_event, get_job, transition
from service.db.models import Checkpoint, Job, JobAttempt, JobEvent, utcnow
from service.db.session import session_scope
from service.model_source import resolve_model_source
from service.spec import SpecError
from worker.artifacts import checkpoint_row, drop_partial, find_checkpoint, sha256_file, workdir
from worker.callback import JobCallback
from worker.datasets import resolve_dataset
from worker.lease import Heartbeat, Preemption, Stopper
from worker.problems import JobTimeout, Preempted, problem_for
from worker.recorder import Recorder
from worker.report import compression_report, compression_summary, val_metrics

if TYPE_CHECKING:
    from engine.train import JobConfig, Trainer, TrainResult

__all__ = ["claim", "close_attempt", "deadline_for", "run_job", "worker_name"]

log = logging.getLogger(__name__)
S = JobState
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

    def status(self) -> dict[str, Any]:
        p = self.recorder.progress
        out = {"step": p.get("step"), "stage": p.get("stage_name")}
        training = sys.modules.get("worker.training")  # loaded once the job is claimed
        gpu_memory = getattr(training, "gpu_memory", None)  # None while still importing
        memory = gpu_memory() if gpu_memory is not None else None
        if memory is not None:
            out["gpu_memory_bytes"] = memory
        return out


def claim(factory: sessionmaker[Session], *, job_id: str, attempt: int, owner: str,
          lease_seconds: float) -> Job | None:  # fmt: skip
    """QUEUED -> STARTING for ``attempt`` with our lease, and the attempt row; None: lost."""
    now = utcnow()
    with session_scope(factory) as s:
        job = transition(session=s, job_id=job_id, from_states=[S.QUEUED], to_state=S.STARTING,
                         attempt=attempt, lease_owner=owner,
                         lease_expires_at=now + timedelta(seconds=lease_seconds),
                         started_at=func.coalesce(Job.started_at, now), finished_at=None,
                         error=None, enqueue_pending=False, message="preparing data and model",
                         event={"worker": owner})  # fmt: skip
        if job is None:
            return None
        q = (update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
             .values(worker=owner, started_at=now, ended_at=None, exit_reason=None))  # fmt: skip
        if s.execute(q).rowcount == 0:
            s.add(JobAttempt(job_id=job_id, tenant_id=job.tenant_id, attempt=attempt,
                             worker=owner, started_at=now))  # fmt: skip
        return job


def close_attempt(session: Session, *, job_id: str, attempt: int, reason: str) -> None:
    """Set ``ended_at`` and ``exit_reason`` unless someone (the reaper) already closed it."""
    end_attempt(session=session, job_id=job_id, attempt=attempt, reason=reason)


def run_job(*, job_id: str, attempt: int, settings: Settings, factory: sessionmaker[Session],
            deadline: float | None = None, callbacks: Iterable[Any] = ()) -> str:  # fmt: skip
    """Run one attempt; returns ``succeeded``, ``failed``, ``cancelled``, ``preempted``,
    ``skipped`` or ``lost``. ``deadline``: when to stop as ``timeout`` (``time.monotonic()``;
    default: from the spec's ``limits.max_wall_time_s``, see :func:`deadline_for`);
    ``callbacks``: more engine callbacks (observability, tests)."""
    t0, owner = time.monotonic(), worker_name()
    job = claim(factory, job_id=job_id, attempt=attempt, owner=owner,
                lease_seconds=settings.lease_seconds)  # fmt: skip
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
    run = Attempt(settings, factory, job_id, attempt, owner, recorder, extra=list(callbacks))
    heartbeat = Heartbeat(factory=factory, job_id=job_id, attempt=attempt, owner=owner,
                          lease_seconds=settings.lease_seconds,
                          interval=settings.heartbeat_seconds, status=run.status)  # fmt: skip
    heartbeat.start()
    run.preemption.install()
    try:
        return _run(run, job, heartbeat, t0 if deadline is None else None, deadline)
    except Exception as exc:  # classified; BaseException (shutdown) is left to the reaper
        return _fail(run, exc)
    finally:
        run.preemption.restore()
        heartbeat.stop()


def _run(run: Attempt, job: Job, heartbeat: Heartbeat, t0: float | None,
         deadline: float | None) -> str:  # fmt: skip
    from worker import training

    settings = run.settings
    spec = JobCreate.model_validate(job.spec)
    with session_scope(run.factory) as s:
        train, valid = resolve_dataset(session=s, settings=settings, tenant_id=job.tenant_id,
                                       spec=spec.dataset)  # fmt: skip
    model_dir = resolve_model_source(data_root=settings.data, model=spec.model)  # or None
    config, device = training.build_config(spec, train=train, valid=valid, model=model_dir)
    names = [stage.label for stage in config.schedule]
    run.callback = JobCallback(recorder=run.recorder, stage_names=names,
                               artifacts=settings.artifacts, tenant_id=job.tenant_id)  # fmt: skip
    if deadline is None and t0 is not None:
        deadline = deadline_for(spec.limits.max_wall_time_s, t0)
    stopper = Stopper(factory=run.factory, job_id=run.job_id, owner=run.owner,
                      deadline=deadline, heartbeat=heartbeat,
                      preempted=run.preemption.event)  # fmt: skip
    trainer, resumed = _trainer(run, job, config, stopper)
    run.recorder.set_progress(total_steps=training.total_steps(trainer, config))
    with session_scope(run.factory) as s:
        running = transition(session=s, job_id=run.job_id, from_states=[S.STARTING],
                             to_state=S.RUNNING, attempt=run.attempt,
                             engine_config=config.to_dict(),
                             engine_version=training.ENGINE_VERSION,
                             message="running",
                             event={"device": device,
                                    "resumed_from": resumed.id if resumed else None})  # fmt: skip
        if running is not None and resumed is not None:
            s.execute(update(JobAttempt).where(JobAttempt.job_id == run.job_id,
                                               JobAttempt.attempt == run.attempt)
                      .values(resume_from=resumed.id))  # fmt: skip
    if running is None:  # cancelled (or taken away) while starting
        return _interrupted(run, stopper.poll() or "lost")
    result = trainer.run()
    run.recorder.flush()
    if result.status == "completed":
        return _succeed(run, job, trainer, result)
    if stopper.reason == "deadline":
        raise JobTimeout(f"stopped at step {run.recorder.progress.get('step')}, at the "
                         "wall-time limit (limits.max_wall_time_s)")  # fmt: skip
    if stopper.reason == "preempted":
        return _preempted(run, job)
    return _interrupted(run, stopper.reason or "lost")


def _trainer(run: Attempt, job: Job, config: JobConfig,
             stopper: Stopper) -> tuple[Trainer, Checkpoint | None]:  # fmt: skip
    """The trainer, resumed from the chosen checkpoint (see the module doc)."""
    from worker.training import ResumeError, build_trainer

    artifacts = run.settings.artifacts
    kwargs: dict[str, Any] = {
        "workdir": workdir(artifacts, run.job_id, run.attempt),
        "callbacks": [run.callback, *run.extra],
        "should_stop": stopper,
    }
    explicit = job.resume_from not in (None, "scratch", "latest_checkpoint")
    ckpt = None
    if job.resume_from != "scratch":
        with session_scope(run.factory) as s:
            ckpt = find_checkpoint(s, job_id=run.job_id, tenant_id=job.tenant_id,
                                   artifacts=artifacts,
                                   checkpoint_id=job.resume_from if explicit else None)  # fmt: skip
        if explicit and ckpt is None:
            raise SpecError("/from", f"{job.resume_from} is not an intact, resumable "
                            "checkpoint of this job")  # fmt: skip
    if ckpt is None:
        return build_trainer(config, resume=None, **kwargs), None
    try:
        trainer = build_trainer(config, resume=artifacts / ckpt.path, **kwargs)
    except ResumeError as exc:
        why = str(exc).replace(f"{artifacts}/", "")
        if explicit:
            raise SpecError("/from", f"{ckpt.id} cannot be resumed: {why}") from None
        message = f"checkpoint {ckpt.id} cannot be resumed ({why}); starting from scratch"
        run.recorder.event("log", {"level": "warning", "message": message})
        return build_trainer(config, resume=None, **kwargs), None
    run.recorder.event("log", {"level": "info", "message": f"resumed from checkpoint {ckpt.id} "
                               f"(attempt {ckpt.attempt}, step {ckpt.step})"})  # fmt: skip
    run.recorder.set_progress(step=trainer.state.global_step)
    return trainer, ckpt


def _succeed(run: Attempt, job: Job, trainer: Trainer, result: TrainResult) -> str:
    """Export atomically, register the export with its report, then SUCCEEDED."""
    from worker.training import export_model, measure_fidelity

    stages = result.report["stages"]
    final = stages[-1]["metrics"] if stages else {}
    out = workdir(run.settings.artifacts, run.job_id, run.attempt) / "export"
    info = export_model(trainer, result, out, {"job_id": run.job_id, "attempt": run.attempt,
                                               "spec_hash": job.spec_hash})  # fmt: skip
    names = run.callback.names if run.callback else [None]
    row = checkpoint_row(path=info.weights_path, artifacts=run.settings.artifacts,
                         job_id=run.job_id, tenant_id=job.tenant_id, attempt=run.attempt,
                         kind="export", step=int(result.report["steps"]), stage=names[-1],
                         metrics=val_metrics(final))  # fmt: skip
    if row.sha256 != info.sha256:
        raise RuntimeError(f"the exported weights do not match their manifest ({row.sha256})")
    report = compression_report(job_id=run.job_id, checkpoint_id=row.id, manifest=info.manifest,
                                stages=stages, metrics=val_metrics(final),
                                spec_hash=job.spec_hash,
                                fidelity=measure_fidelity(trainer, out))  # fmt: skip
    files = {info.weights_path.name: {"bytes": row.size_bytes, "sha256": row.sha256},
             info.manifest_path.name: {"bytes": info.manifest_path.stat().st_size,
                                       "sha256": sha256_file(info.manifest_path)}}  # fmt: skip
    row.manifest = {**info.manifest, "files": files, "report": report}
    rec = run.recorder
    rec.row(row)
    rec.event("checkpoint", {"id": row.id, "kind": "export", "step": row.step, "stage": row.stage,
                             "size_bytes": row.size_bytes, "sha256": row.sha256,
                             "state": "complete"})  # fmt: skip
    rec.set_compression(**compression_summary(report))
    rec.set_progress(fraction=1.0)
    ratio = report["file_ratio"]
    message = f"succeeded: file ratio {ratio:.2f}x" if ratio else "succeeded"
    outcome = ["succeeded"]

    def finish(s: Session) -> None:
        done = transition(session=s, job_id=run.job_id, from_states=[S.RUNNING],
                          to_state=S.SUCCEEDED, attempt=run.attempt, message=message)  # fmt: skip
        if done is not None:
            close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="completed")
        else:  # a cancel arrived after the last step, or the lease was lost
            outcome[0] = _cancel(s, run, "cancelled after training completed")

    rec.flush(extra=finish)
    return outcome[0]


def _cancel(s: Session, run: Attempt, message: str) -> str:
    """CANCELLING (if not already) -> CANCELLED for our attempt; "lost" if it is not ours."""
    current = get_job(session=s, job_id=run.job_id)
    if current is not None and current.attempt == run.attempt:
        transition(session=s, job_id=run.job_id, from_states=[S.STARTING, S.RUNNING],
                   to_state=S.CANCELLING, attempt=run.attempt)  # fmt: skip
        current = transition(session=s, job_id=run.job_id, from_states=[S.CANCELLING],
                             to_state=S.CANCELLED, attempt=run.attempt,
                             message=message) or get_job(session=s, job_id=run.job_id)  # fmt: skip
    ours = current is not None and current.attempt == run.attempt
    cancelled = ours and current is not None and current.state == S.CANCELLED.value
    close_attempt(s, job_id=run.job_id, attempt=run.attempt,
                  reason="cancelled" if cancelled else "worker_lost")  # fmt: skip
    return "cancelled" if cancelled else "lost"


def _wants_partial(s: Session, job_id: str, tenant_id: str) -> bool:
    """The ``save_partial`` of the job's latest cancel request (default true)."""
    rows = s.scalars(select(JobEvent.data).where(JobEvent.job_id == job_id,
                                                 JobEvent.tenant_id == tenant_id)
                     .order_by(JobEvent.seq.desc()).limit(50))  # fmt: skip
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
                dropped = drop_partial(s, job_id=run.job_id, tenant_id=tenant_id,
                                       attempt=run.attempt,
                                       artifacts=run.callback.artifacts)  # fmt: skip
                for cid in dropped:
                    data = {"id": cid, "state": "deleted", "reason": "save_partial false"}
                    append_event(session=s, job_id=run.job_id, attempt=run.attempt,
                                 kind="checkpoint", data=data)  # fmt: skip
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
        raise Preempted(f"stopped by SIGTERM at step {step}; no attempts left (attempt "
                        f"{run.attempt} of {job.max_attempts})")  # fmt: skip
    moved: list[int] = []

    def finish(s: Session) -> None:
        current = get_job(session=s, job_id=run.job_id)
        if current is not None and current.attempt == run.attempt:
            back = requeue_job(session=s, job=current, from_states=[S.STARTING, S.RUNNING],
                               reason="preempted", send_at=utcnow(),
                               where=[Job.lease_owner == run.owner])  # fmt: skip
            if back is not None:
                moved.append(back.attempt)
                return
        close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="worker_lost")

    run.recorder.flush(extra=finish)
    if not moved:
        return "lost"
    log.warning("job %s attempt %s: preempted at step %s; attempt %s queued", run.job_id,
                run.attempt, step, moved[0])  # fmt: skip
    from service.queue import enqueue  # a Celery client; the reaper sends it if this fails

    wall = int((job.spec.get("limits") or {}).get("max_wall_time_s") or 6 * 3600)
    if enqueue(settings=run.settings, job_id=run.job_id, attempt=moved[0], max_wall_time_s=wall):
        with session_scope(run.factory) as s:
            mark_sent(session=s, job_id=run.job_id, attempt=moved[0], now=utcnow())
    return "preempted"


def _fail(run: Attempt, exc: Exception) -> str:
    """FAILED with the problem object of ``exc`` (never over a terminal state)."""
    p = run.recorder.progress
    kind, problem = problem_for(exc, step=p.get("step"), stage=p.get("stage_name"),
                                roots=(run.settings.data, run.settings.artifacts))  # fmt: skip
    if kind == "error":
        log.exception("job %s attempt %s failed", run.job_id, run.attempt)
    else:
        log.warning("job %s attempt %s failed (%s): %s", run.job_id, run.attempt, kind,
                    problem["detail"])  # fmt: skip
    try:  # keep what was measured up to the failure
        run.recorder.flush()
    except Exception:
        log.exception("job %s: could not flush the last points", run.job_id)
    with session_scope(run.factory) as s:
        transition(session=s, job_id=run.job_id, from_states=[S.STARTING, S.RUNNING, S.CANCELLING],
                   to_state=S.FAILED, attempt=run.attempt, error=problem,
                   message=f"{problem['title']}: {problem['detail']}")  # fmt: skip
        close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason=kind)
    return "failed"
