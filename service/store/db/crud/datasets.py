"""Uploaded datasets: rows of files under ``<artifacts>/datasets/`` (checked before use)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.store.db.crud.job_queries import unfinished_job_refers
from service.store.db.crud.uploads import delete_upload, get_upload, list_uploads
from service.store.db.models import Dataset

__all__ = ["create_dataset", "dataset_in_use", "delete_dataset", "get_dataset", "list_datasets"]


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


def get_dataset(*, session: Session, tenant_id: str, dataset_id: str) -> Dataset | None:
    return get_upload(session=session, table=Dataset, tenant_id=tenant_id, upload_id=dataset_id)


def list_datasets(
    *, session: Session, tenant_id: str, cursor: str | None, limit: int
) -> tuple[list[Dataset], str | None]:
    return list_uploads(
        session=session, table=Dataset, tenant_id=tenant_id, cursor=cursor, limit=limit
    )


def dataset_in_use(*, session: Session, tenant_id: str, dataset_id: str) -> bool:
    """Whether a job that has not finished reads this dataset."""
    return unfinished_job_refers(
        session=session, tenant_id=tenant_id, path=("dataset", "dataset_id"), value=dataset_id
    )


def delete_dataset(*, session: Session, dataset: Dataset) -> None:
    delete_upload(session=session, table=Dataset, row=dataset)
