"""Dataset uploads: a raw body streamed to disk, hashed, size-limited, then format-checked.

The body goes to a temporary file in ``<artifacts>/datasets/`` while its sha256 is computed;
past ``max_upload_bytes`` or the tenant's storage quota (declared or streamed) the request
fails with 413 and the partial file is removed, as it is after 30 s without data (408); a
tenant runs a few uploads at once (429 past that; ``service.upload_limits``). The complete
file is checked (``service.upload_checks``) in a worker thread; a malformed file is a 422
with the reason and nothing is kept. Only a file that passed is renamed to
``datasets/<id>`` and gets its row.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.errors import FieldProblem
from service.middleware import content_length_exceeds
from service.store.db.models import Dataset, UploadedModel
from service.store.ids import new_id
from service.store.settings import Settings
from service.upload_checks import UploadRejected, check_format
from service.upload_limits import (
    UploadSlots,
    idle_stream,
    over_quota,
    quota_left,
    stored_bytes,
)

__all__ = [
    "DATASETS_DIR",
    "receive_to_file",
    "record_upload",
    "store_upload",
    "too_large",
    "upload_slots",
]

DATASETS_DIR = "datasets"
Upload = TypeVar("Upload", Dataset, UploadedModel)


def too_large(limit: int) -> HTTPException:
    """413: the upload is past ``limit`` bytes (declared or streamed)."""
    return HTTPException(413, f"The upload exceeds {limit} bytes.")


async def receive_to_file(
    request: Request, folder: Path, max_bytes: int, idle_seconds: float | None = None
) -> tuple[Path, int, str]:
    """(temporary file, size, sha256 hex) of the request body; 413 past ``max_bytes``, 408
    when no data comes for ``idle_seconds``."""
    declared = request.headers.get("content-length", "")
    if content_length_exceeds(declared, max_bytes):
        raise too_large(max_bytes)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".upload-", suffix=".tmp")
    tmp, digest, size = Path(name), hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as f:
            chunks = (
                request.stream() if idle_seconds is None else idle_stream(request, idle_seconds)
            )
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(max_bytes)
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, size, digest.hexdigest()


async def store_upload(
    *, request: Request, session: Session, settings: Settings, tenant_id: str, name: str, fmt: str
) -> Dataset:
    """Receive, check and keep one dataset; 408 / 413 / 422 / 429 leave nothing behind."""
    with upload_slots(request, settings).hold(tenant_id):
        return await _store(request, session, settings, tenant_id, name, fmt)


def upload_slots(request: Request, settings: Settings) -> UploadSlots:
    """This API process's upload slots (service.upload_limits), datasets and models alike."""
    state = request.app.state
    slots: UploadSlots | None = getattr(state, "upload_slots", None)
    if slots is None:
        slots = state.upload_slots = UploadSlots(
            settings.max_uploads_per_tenant, settings.max_uploads
        )
    return slots


async def _store(
    request: Request, session: Session, settings: Settings, tenant_id: str, name: str, fmt: str
) -> Dataset:
    folder = Path(settings.artifacts) / DATASETS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    quota = settings.max_dataset_bytes_per_tenant
    left = await run_in_threadpool(quota_left, session, tenant_id, quota)
    limit = min(settings.max_upload_bytes, left)
    try:
        tmp, size, sha = await receive_to_file(request, folder, limit, settings.upload_idle_seconds)
    except HTTPException as err:
        if err.status_code == 413 and limit < settings.max_upload_bytes:
            raise over_quota(quota, quota - left) from None  # the quota, not the size limit
        raise
    try:
        rows = await run_in_threadpool(check_format, tmp, fmt)
    except UploadRejected as err:
        tmp.unlink(missing_ok=True)
        raise FieldProblem.one("", str(err), "format") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dataset_id = new_id("ds")
    final = folder / dataset_id
    os.replace(tmp, final)
    row = Dataset(
        id=dataset_id,
        tenant_id=tenant_id,
        name=name,
        format=fmt,
        path=f"{DATASETS_DIR}/{dataset_id}",
        size_bytes=size,
        sha256=sha,
        rows=rows,
        state="ready",
    )
    discard = partial(final.unlink, missing_ok=True)
    return await record_upload(session=session, row=row, quota=quota, discard=discard)


async def record_upload(
    *, session: Session, row: Upload, quota: int, discard: Callable[[], object]
) -> Upload:
    """Add ``row``, the record of an upload that passed its checks and was renamed into place,
    and commit it in a worker thread if its tenant's quota still holds its ``size_bytes``
    (uploads that finished meanwhile count too; else 413). On any failure ``discard()`` removes
    what was kept."""
    table = type(row)

    def record() -> Upload:
        used = stored_bytes(session, row.tenant_id, table)
        if used + row.size_bytes > quota:
            raise over_quota(quota, used, table.__tablename__)
        session.add(row)
        session.commit()
        return row

    try:
        return await run_in_threadpool(record)
    except BaseException:
        discard()
        raise
