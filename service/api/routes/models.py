"""``/v1/models``: upload a Hugging Face model directory (one tar, or multipart files;
streamed), list, read and delete it. A job names it as ``model.source: {"kind":
"uploaded", "id": ...}`` (``arch: hf``).

The upload route is exempt from the 1 MiB body limit; it has its own
(``max_model_upload_bytes``) and streams to disk (``service.model_uploads``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response

from api_schemas import UploadedModelPublic, UploadedModelsPublic
from service.api.deps import SessionDep, SettingsDep, TenantDep
from service.api.routes.uploaded import RAW_BODY, add_upload_routes, media_type
from service.errors import problems
from service.model_uploads import store_model_upload
from service.store.db.crud.uploads import MODELS
from service.views import model_public

router = APIRouter(prefix="/models", tags=["models"])
# the tar's media types (octet-stream as for datasets; gzip is read too)
TAR_TYPES = (
    "application/x-tar",
    "application/octet-stream",
    "application/tar",
    "application/gzip",
    "application/x-gzip",
)


@router.post(
    "",
    status_code=201,
    response_model=UploadedModelPublic,
    openapi_extra=RAW_BODY,
    responses=problems(408, 413, 415, 422, 429),
)
async def upload_model(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
    response: Response,
    name: Annotated[str, Query(min_length=1, max_length=128, pattern=r"^[\w.\- ]+$")],
) -> UploadedModelPublic:
    """Upload a model directory as one tar (``Content-Type: application/x-tar`` or
    ``application/octet-stream``; gzip read too) or as ``multipart/form-data`` file parts:
    ``config.json``, ``model.safetensors``, ``tokenizer.json`` and other JSON / text files,
    at the top level or under one folder of the tar.
    Pickles and code are refused by name, the directory is checked as an ``hf`` job's model
    before anything is kept (422 with the reason); 408 / 413 / 429 as for datasets."""
    if media_type(request) not in (*TAR_TYPES, "multipart/form-data"):
        raise HTTPException(
            415, "Send the model directory as one tar (application/x-tar) or multipart files."
        )
    row = await store_model_upload(
        request=request, session=session, settings=settings, tenant_id=tenant.id, name=name
    )
    response.headers["Location"] = f"/v1/models/{row.id}"
    return model_public(row)


def _remove_directory(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


add_upload_routes(
    router,
    kind=MODELS,
    noun="model",
    public=model_public,
    item=UploadedModelPublic,
    page=UploadedModelsPublic,
    remove_files=_remove_directory,
    files="files",
)
