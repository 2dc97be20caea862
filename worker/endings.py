"""How an attempt ends: succeeded, cancelled, lease lost, preempted, or failed.

An ending writes its state change in the transaction of the recorder's last flush where it
can, so the last points and the new state land together. Every end closes the attempt row
(``ended_at``, ``exit_reason``). Transitions are compare-and-set, so a terminal state is never
overwritten; when the lease was lost the job belongs to someone else and is left alone
(``"lost"``).

* :func:`succeed`: the export's rows (:func:`worker.artifacts.export_rows`) with its
  compression report (:mod:`worker.report`), the job's compression summary, then SUCCEEDED;
  a cancel that arrived after the last step cancels it instead.
* :func:`stopped`: after the trainer stopped on a :class:`worker.lease.Stopper` answer: the
  deadline fails it as ``timeout``, a preemption requeues it, a cancel cancels it.
* :func:`interrupted`: a cancel -> CANCELLED (the partial checkpoint dropped when the cancel
  said ``save_partial: false``); a lost lease -> the attempt closed, the job left alone.
* :func:`preempted`: SIGTERM and no cancel: the partial checkpoint is written; the job goes
  back to QUEUED as attempt n+1 (resuming from it) and its message is sent at once (the
  reaper sends it if that fails); with no attempts left it is FAILED as ``preempted``.
* :func:`fail`: FAILED with the problem object of the exception (:mod:`worker.problems`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from api_schemas import JobState
from service.store.db.crud.attempts import cancel_saves_partial, requeue_preempted
from service.store.db.crud.job_actions import end_attempt, mark_sent
from service.store.db.crud.jobs import get_job
from service.store.db.models import Job, utcnow
from service.store.db.session import session_scope
from worker.artifacts import drop_partial, export_rows, log_deleted
from worker.attempt import Attempt
from worker.lease import Stopper
from worker.problems import JobTimeout, Preempted, problem_for
from worker.report import compression_report, compression_summary, success_message, val_metrics

if TYPE_CHECKING:
    from engine.export import ExportInfo

__all__ = ["cancel", "close_attempt", "fail", "interrupted", "preempted", "stopped", "succeed"]

log = logging.getLogger(__name__)
S = JobState


def close_attempt(session: Session, *, job_id: str, attempt: int, reason: str) -> None:
    """Set ``ended_at`` and ``exit_reason`` unless someone (the reaper) already closed it."""
    end_attempt(session=session, job_id=job_id, attempt=attempt, reason=reason)


def succeed(
    run: Attempt,
    job: Job,
    report: dict[str, Any],
    info: ExportInfo,
    fidelity: dict[str, Any] | None,
    keep: int,
) -> str:
    """Register the export (its rows, with the compression report from the engine's
    ``report``), the job's compression summary, then SUCCEEDED; ``keep``: the job's
    ``checkpointing.keep``, applied once it succeeded."""
    stages = report["stages"]
    final = stages[-1]["metrics"] if stages else {}
    names = run.callback.names if run.callback else [None]
    row, *archives = export_rows(
        info,
        artifacts=run.settings.artifacts,
        job_id=run.job_id,
        tenant_id=job.tenant_id,
        attempt=run.attempt,
        step=int(report["steps"]),
        stage=names[-1],
        metrics=val_metrics(final),
    )
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
    row.manifest = {**(row.manifest or {}), "report": compression}
    rec = run.recorder
    for r in [row, *archives]:
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
        done = run.move(s, [S.RUNNING], S.SUCCEEDED, message=message)
        if done is not None:
            close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="completed")
            run.retain(s, tenant_id=job.tenant_id, keep=keep)
        else:  # a cancel arrived after the last step, or the lease was lost
            outcome[0] = cancel(s, run, "cancelled after training completed")

    rec.flush(extra=finish)
    return outcome[0]


def stopped(run: Attempt, job: Job, stopper: Stopper) -> str:
    """After a stop asked for by ``stopper``: the deadline, a preemption, a cancel, a lost
    lease."""
    if stopper.reason == "deadline":
        raise JobTimeout(
            f"stopped at step {run.recorder.progress.get('step')}, at the "
            "wall-time limit (limits.max_wall_time_s)"
        )
    if stopper.reason == "preempted":
        return preempted(run, job)
    return interrupted(run, stopper.reason or "lost")


def cancel(s: Session, run: Attempt, message: str) -> str:
    """CANCELLING (if not already) -> CANCELLED for our attempt; "lost" if it is not ours."""
    current = get_job(session=s, job_id=run.job_id)
    if current is not None and current.attempt == run.attempt:
        run.move(s, [S.STARTING, S.RUNNING], S.CANCELLING)
        current = run.move(s, [S.CANCELLING], S.CANCELLED, message=message) or get_job(
            session=s, job_id=run.job_id
        )
    ours = current is not None and current.attempt == run.attempt
    cancelled = ours and current is not None and current.state == S.CANCELLED.value
    close_attempt(
        s,
        job_id=run.job_id,
        attempt=run.attempt,
        reason="cancelled" if cancelled else "worker_lost",
    )
    return "cancelled" if cancelled else "lost"


def interrupted(run: Attempt, reason: str) -> str:
    """After a cooperative stop: cancel -> CANCELLED; lease lost -> leave the job alone."""
    outcome = ["lost"]
    if reason == "cancel":
        ids = run.callback.checkpoints if run.callback else []
        step = run.recorder.progress.get("step")
        message = f"cancelled at step {step}" + (f"; partial checkpoint {ids[-1]}" if ids else "")

        def finish(s: Session) -> None:
            tenant_id = run.recorder.tenant_id
            if (
                ids
                and not cancel_saves_partial(session=s, job_id=run.job_id, tenant_id=tenant_id)
                and run.callback is not None
            ):
                dropped = drop_partial(
                    s,
                    job_id=run.job_id,
                    tenant_id=tenant_id,
                    attempt=run.attempt,
                    artifacts=run.callback.artifacts,
                )
                reason = "save_partial false"
                log_deleted(s, job_id=run.job_id, attempt=run.attempt, ids=dropped, reason=reason)
            outcome[0] = cancel(s, run, message)

        run.recorder.flush(extra=finish)
    else:
        log.warning("job %s attempt %s: lease lost; leaving the job", run.job_id, run.attempt)
        with session_scope(run.factory) as s:
            close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason="worker_lost")
    return outcome[0]


def preempted(run: Attempt, job: Job) -> str:
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
            back = requeue_preempted(session=s, job=current, owner=run.owner)
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


def fail(run: Attempt, exc: Exception, spec: dict[str, Any] | None = None) -> str:
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
        run.move(
            s,
            [S.STARTING, S.RUNNING, S.CANCELLING],
            S.FAILED,
            error=problem,
            message=f"{problem['title']}: {problem['detail']}",
        )
        close_attempt(s, job_id=run.job_id, attempt=run.attempt, reason=kind)
    return "failed"
