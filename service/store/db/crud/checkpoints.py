"""Reading checkpoints (rows the worker writes) and what the compression report needs.

Every read filters on the tenant as well as the job: a checkpoint of another tenant's job is
not found even given its job id (docs/service.md#authentication-and-tenancy)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.db.models import Checkpoint, JobEvent

__all__ = ["get_checkpoint", "list_checkpoints", "newest_export", "stage_events"]


def list_checkpoints(*, session: Session, tenant_id: str, job_id: str) -> list[Checkpoint]:
    q = select(Checkpoint).where(Checkpoint.tenant_id == tenant_id, Checkpoint.job_id == job_id)
    return list(session.scalars(q.order_by(Checkpoint.created_at, Checkpoint.id)))


def get_checkpoint(
    *, session: Session, tenant_id: str, job_id: str, checkpoint_id: str
) -> Checkpoint | None:
    q = select(Checkpoint).where(
        Checkpoint.tenant_id == tenant_id,
        Checkpoint.job_id == job_id,
        Checkpoint.id == checkpoint_id,
    )
    return session.scalars(q).first()


def newest_export(*, session: Session, tenant_id: str, job_id: str) -> Checkpoint | None:
    """The newest complete ``export`` checkpoint (the compressed model) of the job."""
    q = select(Checkpoint).where(
        Checkpoint.tenant_id == tenant_id,
        Checkpoint.job_id == job_id,
        Checkpoint.kind == "export",
        Checkpoint.state == "complete",
    )
    return session.scalars(q.order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc())).first()


def stage_events(*, session: Session, tenant_id: str, job_id: str) -> list[dict[str, Any]]:
    """The data of the job's ``stage`` events, in order (the per-stage summary)."""
    q = select(JobEvent.data).where(
        JobEvent.tenant_id == tenant_id, JobEvent.job_id == job_id, JobEvent.kind == "stage"
    )
    return [dict(d) for d in session.scalars(q.order_by(JobEvent.seq))]
