"""Reading checkpoints (rows the worker writes) and what the compression report needs.

Every read filters on the tenant as well as the job: a checkpoint of another tenant's job is
not found even given its job id (docs/service.md#authentication-and-tenancy). The worker's
reads of complete checkpoints (resume choice, retention, a cancel's partials) are here too:
:func:`complete_checkpoints`, :func:`complete_checkpoint`, :func:`path_shared`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.db.models import Checkpoint, JobEvent

__all__ = [
    "complete_checkpoint",
    "complete_checkpoints",
    "get_checkpoint",
    "list_checkpoints",
    "newest_export",
    "path_shared",
    "stage_events",
]


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


def complete_checkpoints(
    *,
    session: Session,
    tenant_id: str,
    job_id: str,
    kinds: Sequence[str],
    attempt: int | None = None,
    newest_first: bool = False,
) -> list[Checkpoint]:
    """The job's ``complete`` checkpoints of ``kinds`` (of ``attempt`` only, if given); newest
    first (by creation, then id) if ``newest_first``, else in no set order."""
    q = select(Checkpoint).where(
        Checkpoint.job_id == job_id,
        Checkpoint.tenant_id == tenant_id,
        Checkpoint.state == "complete",
        Checkpoint.kind.in_(kinds),
    )
    if attempt is not None:
        q = q.where(Checkpoint.attempt == attempt)
    if newest_first:
        q = q.order_by(Checkpoint.created_at.desc(), Checkpoint.id.desc())
    return list(session.scalars(q).all())


def complete_checkpoint(
    *, session: Session, tenant_id: str, job_id: str, checkpoint_id: str, kinds: Sequence[str]
) -> Checkpoint | None:
    """Checkpoint ``checkpoint_id`` of the job if it is ``complete`` and of one of ``kinds``."""
    q = select(Checkpoint).where(
        Checkpoint.job_id == job_id,
        Checkpoint.tenant_id == tenant_id,
        Checkpoint.state == "complete",
        Checkpoint.id == checkpoint_id,
        Checkpoint.kind.in_(kinds),
    )
    return session.scalars(q).first()


def path_shared(
    *, session: Session, tenant_id: str, job_id: str, path: str, other_than: str
) -> bool:
    """Whether another ``complete`` checkpoint of the job than ``other_than`` names the file
    ``path`` (a stop right at a periodic checkpoint rewrote it as the partial)."""
    q = select(Checkpoint.id).where(
        Checkpoint.job_id == job_id,
        Checkpoint.path == path,
        Checkpoint.tenant_id == tenant_id,
        Checkpoint.state == "complete",
        Checkpoint.id != other_than,
    )
    return session.scalars(q).first() is not None
