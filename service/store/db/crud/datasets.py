"""Uploaded datasets: rows of files under ``<artifacts>/datasets/`` (checked before use)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.store.db.crud.uploads import UploadKind
from service.store.db.models import Dataset

__all__ = ["DATASETS", "create_dataset"]

DATASETS = UploadKind(Dataset, job_ref=("dataset", "dataset_id"))


def create_dataset(
    *,
    session: Session,
    dataset_id: str,
    tenant_id: str,
    name: str,
    fmt: str,
    path: str,
    size_bytes: int,
    sha256: str,
    rows: int | None,
) -> Dataset:
    ds = Dataset(
        id=dataset_id,
        tenant_id=tenant_id,
        name=name,
        format=fmt,
        path=path,
        size_bytes=size_bytes,
        sha256=sha256,
        rows=rows,
        state="ready",
    )
    session.add(ds)
    session.flush()
    return ds
