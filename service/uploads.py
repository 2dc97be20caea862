"""Dataset uploads: a raw body streamed to disk, hashed, size-limited, then format-checked.

The body goes to a temporary file in ``<artifacts>/datasets/`` while its sha256 is computed;
past ``max_upload_bytes`` (declared or streamed) the request fails with 413 and the partial
file is removed. The complete file is checked (``service.upload_checks``) in a worker
thread; a malformed file is a 422 with the reason and nothing is kept. Only a file that
passed is renamed to ``datasets/<id>`` and gets its row.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.core.config import Settings
from service.db.crud.datasets import create_dataset
from service.db.models import Dataset
from service.errors import FieldProblem
from service.ids import new_id
from service.upload_checks import UploadRejected, check_format

__all__ = ["DATASETS_DIR", "receive_to_file", "store_upload"]

DATASETS_DIR = "datasets"


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"The upload exceeds {limit} bytes.")


async def receive_to_file(request: Request, folder: Path, max_bytes: int) -> tuple[Path, int, str]:
    """(temporary file, size, sha256 hex) of the request body; 413 past ``max_bytes``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".upload-", suffix=".tmp")
    tmp, digest, size = Path(name), hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise _too_large(max_bytes)
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, size, digest.hexdigest()


async def store_upload(*, request: Request, session: Session, settings: Settings,
                       tenant_id: str, name: str, fmt: str) -> Dataset:  # fmt: skip
    """Receive, check and keep one dataset; 413 / 422 leave nothing behind."""
    folder = Path(settings.artifacts) / DATASETS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp, size, sha = await receive_to_file(request, folder, settings.max_upload_bytes)
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

    def record() -> Dataset:
        row = create_dataset(session=session, dataset_id=dataset_id, tenant_id=tenant_id,
                             name=name, fmt=fmt, path=f"{DATASETS_DIR}/{dataset_id}",
                             size_bytes=size, sha256=sha, rows=rows)  # fmt: skip
        session.commit()
        return row

    try:
        return await run_in_threadpool(record)
    except BaseException:
        final.unlink(missing_ok=True)
        raise
