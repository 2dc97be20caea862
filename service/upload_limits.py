"""What one tenant's uploads may take from the service: time, parallel streams, disk.

* **Idle timeout** (``COMERA_UPLOAD_IDLE_SECONDS``, 30): a body that sends nothing for that
  long is dropped with a 408 and its temporary file removed; a stalled client cannot hold a
  file and a request open.
* **Parallel uploads** (``COMERA_MAX_UPLOADS_PER_TENANT``, 4, and ``COMERA_MAX_UPLOADS``, 32,
  in all): past either, 429 with ``Retry-After``. Counted per API process.
* **Storage quota** (``COMERA_MAX_DATASET_BYTES_PER_TENANT``, 20 GiB): the sizes of a tenant's
  datasets plus the new one; an upload that would go past it is a 413 naming the quota, before
  anything is read when ``Content-Length`` says so, else once the stream passes it. Checked
  again when the dataset is recorded, so uploads racing each other cannot both land over it.
  Uploaded models (``service.model_uploads``) have their own quota
  (``COMERA_MAX_MODEL_BYTES_PER_TENANT``), counted the same way over their table.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi import HTTPException, Request
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.db.models import Dataset, UploadedModel

Stored = type[Dataset] | type[UploadedModel]  # a table of uploads with tenant_id, size_bytes

__all__ = ["UploadSlots", "idle_stream", "over_quota", "quota_left", "stored_bytes"]

RETRY_AFTER_S = "5"


@dataclass
class UploadSlots:
    """Uploads in flight in this API process, per tenant and in all (see the module doc)."""

    per_tenant: int
    total: int
    _open: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def hold(self, tenant_id: str) -> Iterator[None]:
        """One slot for the duration of an upload; 429 when none is free."""
        if sum(self._open.values()) >= self.total:
            raise _busy(f"The service takes {self.total} uploads at once; try again shortly.")
        if self._open.get(tenant_id, 0) >= self.per_tenant:
            raise _busy(
                f"At most {self.per_tenant} uploads of one tenant run at once; "
                "wait for one to finish."
            )
        self._open[tenant_id] = self._open.get(tenant_id, 0) + 1
        try:
            yield
        finally:
            left = self._open.pop(tenant_id) - 1
            if left:
                self._open[tenant_id] = left


def _busy(detail: str) -> HTTPException:
    return HTTPException(429, detail, headers={"Retry-After": RETRY_AFTER_S})


async def idle_stream(request: Request, idle_seconds: float) -> AsyncIterator[bytes]:
    """The request body's chunks; 408 when none arrives for ``idle_seconds``."""
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(chunks), idle_seconds)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise HTTPException(
                408,
                f"The upload sent no data for {idle_seconds:g} s and was dropped; "
                "send the file again.",
                headers={"Connection": "close"},
            ) from None
        yield chunk


def stored_bytes(session: Session, tenant_id: str, table: Stored = Dataset) -> int:
    """Bytes of the tenant's stored datasets (or rows of ``table``)."""
    q = select(func.coalesce(func.sum(table.size_bytes), 0)).where(table.tenant_id == tenant_id)
    return int(session.scalar(q) or 0)


def over_quota(quota: int, used: int, what: str = "datasets") -> HTTPException:
    return HTTPException(
        413,
        f"The tenant's {what} would exceed their storage quota of {quota} bytes "
        f"({used} bytes stored); delete {what} that are no longer needed.",
    )


def quota_left(session: Session, tenant_id: str, quota: int, table: Stored = Dataset) -> int:
    """Bytes the tenant may still upload; 413 when nothing is left."""
    used = stored_bytes(session, tenant_id, table)
    session.rollback()  # no connection held while the body streams
    if used >= quota:
        raise over_quota(quota, used, table.__tablename__)
    return quota - used
