"""The rows of a tenant's uploads, datasets (files under ``<artifacts>/datasets/``) and models
(Hugging Face directories under ``<artifacts>/models/``) alike: one by id, a page of them,
whether a job still reads one, and deleting one (:data:`DATASETS`, :data:`MODELS`). A row is
added, checked, by ``service.uploads.record_upload``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.db.crud.job_queries import unfinished_job_refers
from service.store.db.crud.pagination import keyset_page
from service.store.db.models import Dataset, UploadedModel

__all__ = ["DATASETS", "MODELS", "UploadKind"]

Upload = TypeVar("Upload", Dataset, UploadedModel)


@dataclass(frozen=True)
class UploadKind(Generic[Upload]):
    """A table of uploads and the path in a job's spec that names one of its rows by id."""

    table: type[Upload]
    job_ref: tuple[str, ...]

    def get(self, *, session: Session, tenant_id: str, upload_id: str) -> Upload | None:
        """The tenant's row with this id (None for another tenant's)."""
        t = self.table
        q = select(t).where(t.id == upload_id, t.tenant_id == tenant_id)
        return session.scalars(q).first()

    def page(
        self, *, session: Session, tenant_id: str, cursor: str | None, limit: int
    ) -> tuple[list[Upload], str | None]:
        """A page of the tenant's rows, newest first, and the next page's cursor."""
        t = self.table
        return keyset_page(
            session=session,
            query=select(t).where(t.tenant_id == tenant_id),
            created=t.created_at,
            ident=t.id,
            cursor=cursor,
            limit=limit,
        )

    def in_use(self, *, session: Session, tenant_id: str, upload_id: str) -> bool:
        """Whether a job of the tenant that has not finished reads this upload."""
        return unfinished_job_refers(
            session=session, tenant_id=tenant_id, path=self.job_ref, value=upload_id
        )

    def delete(self, *, session: Session, row: Upload) -> None:
        """Delete ``row``'s record (its files are the caller's) and detach it from the session."""
        session.execute(delete(self.table).where(self.table.id == row.id))
        session.expunge(row)


DATASETS = UploadKind(Dataset, job_ref=("dataset", "dataset_id"))
MODELS = UploadKind(UploadedModel, job_ref=("model", "source", "id"))
