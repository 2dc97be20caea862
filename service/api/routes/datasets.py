"""``/v1/datasets``: upload a data file (raw streamed body), list, read and delete it.

The upload route is exempt from the 1 MiB body limit; it has its own
(``max_upload_bytes``) and streams to disk instead of reading the body into memory.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response

from api_schemas import DatasetPublic, DatasetsPublic
from service.api.deps import SessionDep, SettingsDep, TenantDep
from service.api.routes.uploaded import RAW_BODY, add_upload_routes, media_type
from service.errors import problems
from service.store.db.crud.uploads import DATASETS
from service.uploads import store_upload
from service.views import dataset_public

router = APIRouter(prefix="/datasets", tags=["datasets"])
Format = Literal["jsonl", "csv", "criteo", "text", "npz"]


@router.post(
    "",
    status_code=201,
    response_model=DatasetPublic,
    openapi_extra=RAW_BODY,
    responses=problems(408, 413, 415, 422, 429),
)
async def upload_dataset(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
    response: Response,
    name: Annotated[str, Query(min_length=1, max_length=128)],
    format: Annotated[Format, Query()],
) -> DatasetPublic:
    """Upload a file (``Content-Type: application/octet-stream``); it is usable by jobs
    (``dataset.source = upload``) only after its format check passed (else 422). 408 after
    30 s without data, 413 past the size limit or the tenant's storage quota, 429 while the
    tenant already runs its uploads at once (``service.upload_limits``)."""
    if media_type(request) != "application/octet-stream":
        raise HTTPException(415, "Send the file as application/octet-stream.")
    ds = await store_upload(
        request=request,
        session=session,
        settings=settings,
        tenant_id=tenant.id,
        name=name,
        fmt=format,
    )
    response.headers["Location"] = f"/v1/datasets/{ds.id}"
    return dataset_public(ds)


add_upload_routes(
    router,
    kind=DATASETS,
    noun="dataset",
    public=dataset_public,
    item=DatasetPublic,
    page=DatasetsPublic,
    remove_files=lambda path: path.unlink(missing_ok=True),
    files="file",
)
