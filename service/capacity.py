"""Whether a registered worker can run a submitted job's placement (``POST /v1/jobs`` and the
dry run): a 422 naming ``/training/devices`` or ``/training/nodes`` when workers have
registered and none consumes the job's queue, the ``waiting_for_capacity`` message when none
has registered yet (``service.store.workers``)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api_schemas import JobCreate
from service.errors import FieldProblem
from service.store.settings import Settings
from service.store.workers import capacity

__all__ = ["check_capacity"]


def check_capacity(*, session: Session, settings: Settings, spec: JobCreate) -> str | None:
    """None when a registered worker runs the job's placement; the job's message when no
    worker has registered; a 422 (:class:`FieldProblem`) when the registered ones cannot."""
    verdict = capacity(
        session=session,
        settings=settings,
        devices=spec.training.devices,
        nodes=spec.training.nodes,
    )
    if verdict.refused is not None:
        pointer, message = verdict.refused
        raise FieldProblem.one(pointer, message, "no_capacity")
    return verdict.waiting
