"""Steps 3 and 4 of a data-parallel job: training in processes of its own.

A job with ``training.devices`` x ``training.nodes`` > 1 trains in processes that
:mod:`worker.processes` starts and follows (``torchrun``, or a Ray Train driver across
machines). This worker checks the checkpoint to resume from (:mod:`worker.resume`), moves the
job to RUNNING, follows the processes' events file into the job's callback, forwards a stop
through their stop file, and registers the export rank 0 wrote. The claim, lease, heartbeat,
checkpoint choice and every ending (:mod:`worker.endings`) are the single-process job's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from service.store.db.models import Job
from worker.artifacts import workdir
from worker.attempt import Attempt, start_running
from worker.endings import interrupted, stopped, succeed
from worker.lease import Stopper
from worker.resume import resume

if TYPE_CHECKING:
    from engine.train import JobConfig

__all__ = ["run_processes"]

log = logging.getLogger(__name__)


def run_processes(
    run: Attempt, job: Job, config: JobConfig, device: str, plan: dict[str, Any], stopper: Stopper
) -> str:
    """Steps 3 and 4 of a data-parallel job, whose processes :mod:`worker.processes` starts
    and follows; the stop grace is ``COMERA_PROCESS_STOP_GRACE_SECONDS``, then SIGTERM and
    ``COMERA_CANCEL_KILL_AFTER_SECONDS`` later SIGKILL."""
    from worker import processes
    from worker.training import check_resumable

    settings = run.settings
    path, resumed = resume(run, job, lambda path: check_resumable(config, path))
    run.recorder.set_progress(total_steps=plan.get("total_steps"))
    world = processes.world_size(config)
    if not start_running(run, job, config, device, resumed, world_size=world):
        return interrupted(run, stopper.poll() or "lost")
    out = workdir(settings.artifacts, run.job_id, run.attempt)
    launch = processes.prepare(
        config,
        out=out,
        resume=path,
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
        return succeed(run, job, outcome.report, info, fidelity, config.checkpoint.keep)
    if outcome.stopped:
        return stopped(run, job, stopper)
    raise outcome.error()
