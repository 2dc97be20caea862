"""Uploaded models: rows of directories under ``<artifacts>/models/`` (checked before use)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.store.db.crud.uploads import UploadKind
from service.store.db.models import UploadedModel

__all__ = ["MODELS", "create_model"]

MODELS = UploadKind(UploadedModel, job_ref=("model", "source", "id"))


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
