"""The dense baseline of a job: what its compression report compares the metrics with.

A job ``B`` is the *dense baseline* of job ``J`` when all of these hold:

* ``B`` belongs to ``J``'s tenant, is not ``J``, and is ``SUCCEEDED``;
* ``B.spec.compression.method == "dense"`` (the wire spelling of an uncompressed run);
* the normalized specs (re-validated by ``JobCreate``, so defaults are filled the same way
  for jobs stored before a field existed) have equal ``model`` (architecture, config and,
  for ``hf_bert``, source and distillation) and equal ``dataset`` sections;
* equal ``training`` sections, ``log_every`` aside (it changes what is logged, not what is
  trained);
* the same schedule length: the total ``steps`` and the total ``epochs`` of all stages, a
  ``steps: "auto"`` stage counted at its ``max_steps`` (a dense run has only ``early``
  stages, so the stage kinds, learning rates and names cannot be compared);
* ``B`` has a complete export checkpoint (the metrics compared are the export's).

Among those, the newest by ``finished_at`` (then ``created_at``) wins. At most
``BASELINE_SCAN`` dense jobs of the same architecture are looked at, newest first.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api_schemas import JobCreate, JobState
from service.store.db.crud.checkpoints import newest_export
from service.store.db.models import Checkpoint, Job

__all__ = ["BASELINE_SCAN", "baseline_key", "find_baseline", "metric_deltas"]

BASELINE_SCAN = 500
IGNORED_TRAINING = ("log_every",)


def baseline_key(spec: dict[str, Any]) -> dict[str, Any] | None:
    """What two specs must share (see the module docstring); None if ``spec`` is invalid."""
    try:
        norm = JobCreate.model_validate(spec).model_dump(mode="json")
    except ValidationError:
        return None
    training = {k: v for k, v in norm["training"].items() if k not in IGNORED_TRAINING}
    stages = norm["schedule"]
    return {
        "model": norm["model"],
        "dataset": norm["dataset"],
        "training": training,
        "steps": sum(_steps(s) for s in stages),
        "epochs": sum(s.get("epochs") or 0 for s in stages),
    }


def _steps(stage: dict[str, Any]) -> int:
    """A stage's steps; a ``steps: "auto"`` stage's bound."""
    steps = stage.get("max_steps") if stage.get("steps") == "auto" else stage.get("steps")
    return int(steps or 0)


def find_baseline(*, session: Session, job: Job) -> tuple[Job, Checkpoint] | None:
    """The dense baseline of ``job`` and its newest export, or None."""
    key = baseline_key(job.spec)
    if key is None:
        return None
    q = (
        select(Job)
        .where(
            Job.tenant_id == job.tenant_id,
            Job.id != job.id,
            Job.state == JobState.SUCCEEDED.value,
            Job.spec[("compression", "method")].as_string() == "dense",
            Job.spec[("model", "arch")].as_string() == key["model"]["arch"],
        )
        .order_by(func.coalesce(Job.finished_at, Job.created_at).desc(), Job.id.desc())
        .limit(BASELINE_SCAN)
    )
    for other in session.scalars(q):
        if baseline_key(other.spec) != key:
            continue
        export = newest_export(session=session, tenant_id=job.tenant_id, job_id=other.id)
        if export is not None:
            return other, export
    return None


def metric_deltas(metrics: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """``metrics[k] - base[k]`` for every key both have."""
    return {k: float(metrics[k]) - float(base[k]) for k in sorted(metrics.keys() & base.keys())}
