"""Uploaded models: rows of directories under ``<artifacts>/models/`` (checked before use)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.store.db.crud.job_queries import unfinished_job_refers
from service.store.db.crud.uploads import delete_upload, get_upload, list_uploads
from service.store.db.models import UploadedModel

__all__ = ["create_model", "delete_model", "get_model", "list_models", "model_in_use"]


def create_model(
    *,
    session: Session,
    model_id: str,
    tenant_id: str,
    name: str,
    model_type: str,
    path: str,
    size_bytes: int,
    sha256: str,
    files: dict[str, Any],
) -> UploadedModel:
    row = UploadedModel(
        id=model_id,
        tenant_id=tenant_id,
        name=name,
        model_type=model_type,
        path=path,
        size_bytes=size_bytes,
        sha256=sha256,
        files=files,
    )
    session.add(row)
    session.flush()
    return row


def get_model(*, session: Session, tenant_id: str, model_id: str) -> UploadedModel | None:
    return get_upload(session=session, table=UploadedModel, tenant_id=tenant_id, upload_id=model_id)


def list_models(
    *, session: Session, tenant_id: str, cursor: str | None, limit: int
) -> tuple[list[UploadedModel], str | None]:
    return list_uploads(
        session=session, table=UploadedModel, tenant_id=tenant_id, cursor=cursor, limit=limit
    )


def model_in_use(*, session: Session, tenant_id: str, model_id: str) -> bool:
    """Whether a job that has not finished reads this model."""
    return unfinished_job_refers(
        session=session, tenant_id=tenant_id, path=("model", "source", "id"), value=model_id
    )


def delete_model(*, session: Session, model: UploadedModel) -> None:
    delete_upload(session=session, table=UploadedModel, row=model)
