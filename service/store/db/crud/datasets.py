"""Uploaded datasets: rows of files under ``<artifacts>/datasets/`` (checked before use)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.db.crud.job_queries import unfinished_job_refers
from service.store.db.crud.pagination import keyset_page
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
    q = select(Dataset).where(Dataset.id == dataset_id, Dataset.tenant_id == tenant_id)
    return session.scalars(q).first()


def list_datasets(
    *, session: Session, tenant_id: str, cursor: str | None, limit: int
) -> tuple[list[Dataset], str | None]:
    q = select(Dataset).where(Dataset.tenant_id == tenant_id)
    return keyset_page(
        session=session,
        query=q,
        created=Dataset.created_at,
        ident=Dataset.id,
        cursor=cursor,
        limit=limit,
    )


def dataset_in_use(*, session: Session, tenant_id: str, dataset_id: str) -> bool:
    """Whether a job that has not finished reads this dataset."""
    return unfinished_job_refers(
        session=session, tenant_id=tenant_id, path=("dataset", "dataset_id"), value=dataset_id
    )


def delete_dataset(*, session: Session, dataset: Dataset) -> None:
    session.execute(delete(Dataset).where(Dataset.id == dataset.id))
    session.expunge(dataset)
