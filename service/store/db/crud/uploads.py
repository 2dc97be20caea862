"""The rows of a tenant's uploads, datasets and models alike: one by id, a page of them, and
deleting one (``crud.datasets`` and ``crud.models`` name their table)."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.db.crud.pagination import keyset_page
from service.store.db.models import Dataset, UploadedModel

__all__ = ["delete_upload", "get_upload", "list_uploads"]

Upload = TypeVar("Upload", Dataset, UploadedModel)


def get_upload(
    *, session: Session, table: type[Upload], tenant_id: str, upload_id: str
) -> Upload | None:
    """The tenant's row of ``table`` with this id (None for another tenant's)."""
    q = select(table).where(table.id == upload_id, table.tenant_id == tenant_id)
    return session.scalars(q).first()


def list_uploads(
    *, session: Session, table: type[Upload], tenant_id: str, cursor: str | None, limit: int
) -> tuple[list[Upload], str | None]:
    """A page of the tenant's rows of ``table``, newest first, and the next page's cursor."""
    q = select(table).where(table.tenant_id == tenant_id)
    return keyset_page(
        session=session,
        query=q,
        created=table.created_at,
        ident=table.id,
        cursor=cursor,
        limit=limit,
    )


def delete_upload(*, session: Session, table: type[Upload], row: Upload) -> None:
    """Delete ``row``'s record (its files are the caller's) and detach it from the session."""
    session.execute(delete(table).where(table.id == row.id))
    session.expunge(row)
