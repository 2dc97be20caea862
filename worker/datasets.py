"""From a job's dataset reference to files the engine may read, on this worker.

The one resolver is the store's (:func:`service.store.prepare.resolve_dataset`, with one error
type, :class:`service.store.prepare.PrepareError`, a ``SpecError`` naming the field, so the
job fails as a validation error that names it); these are its worker-side names, kept for the
callers that resolve a spec's dataset under this worker's roots. The worker itself reads the
job's prepared engine config (:func:`service.store.prepare.worker_engine_config`), which
resolves again only the root-relative paths.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api_schemas import DatasetSpec
from service.store.prepare import Roots
from service.store.prepare import resolve_dataset as _resolve
from service.store.settings import Settings

__all__ = ["resolve_dataset", "roots"]


def roots(*, session: Session, settings: Settings, tenant_id: str) -> Roots:
    """This worker's roots for a job of ``tenant_id`` (its data root, its artifact store)."""
    return Roots.server(settings=settings, session=session, tenant_id=tenant_id)


def resolve_dataset(
    *, session: Session, settings: Settings, tenant_id: str, spec: DatasetSpec
) -> tuple[str | None, str | None]:
    """``(train_path, valid_path)`` as absolute paths (``None`` for what is not a file)."""
    return _resolve(spec, roots(session=session, settings=settings, tenant_id=tenant_id))
