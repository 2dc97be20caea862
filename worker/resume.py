"""Which checkpoint an attempt resumes from, and starting from it.

Unless the job says ``scratch``, an attempt resumes from the checkpoint that
``jobs.resume_from`` names, else from the newest complete ``latest``/``partial`` one of any
attempt whose file is intact (:func:`worker.artifacts.find_checkpoint`). A newest checkpoint
that the trainer refuses (``ResumeError``) is skipped with a warning, and the attempt starts
from scratch; a named one that is missing or refused fails the job with a ``SpecError`` on
``/from``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from api_schemas.engine_spec import SpecError
from service.store.db.models import Checkpoint, Job
from service.store.db.session import session_scope
from worker.artifacts import find_checkpoint
from worker.attempt import Attempt

__all__ = ["resume"]

T = TypeVar("T")


def resume(
    run: Attempt, job: Job, start: Callable[[Path | None], T]
) -> tuple[T, Checkpoint | None]:
    """``start(path)`` from the chosen checkpoint (see the module doc), or ``start(None)``;
    returns what ``start`` returned and the checkpoint it resumed from (None: from scratch)."""
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
