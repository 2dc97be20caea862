"""``/v1/datasets``: upload a data file (raw streamed body), list, read and delete it.

The upload route is exempt from the 1 MiB body limit; it has its own
(``max_upload_bytes``) and streams to disk instead of reading the body into memory.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response

from api_schemas import DatasetPublic, DatasetsPublic
from service.api.deps import SessionDep, SettingsDep, TenantDep
from service.api.routes.uploaded import RAW_BODY, cursor_checked, found, media_type
from service.errors import problems
from service.store.db.crud.datasets import (
    dataset_in_use,
    delete_dataset,
    get_dataset,
    list_datasets,
)
from service.store.storage import artifact_path
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


@router.get("", response_model=DatasetsPublic, responses=problems(400, 422))
def list_datasets_route(
    session: SessionDep,
    tenant: TenantDep,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> DatasetsPublic:
    """The tenant's datasets, newest first."""
    with cursor_checked():
        rows, nxt = list_datasets(session=session, tenant_id=tenant.id, cursor=cursor, limit=limit)
    return DatasetsPublic(items=[dataset_public(d) for d in rows], next_cursor=nxt)


@router.get("/{dataset_id}", response_model=DatasetPublic, responses=problems(404))
def read_dataset(dataset_id: str, session: SessionDep, tenant: TenantDep) -> DatasetPublic:
    ds = get_dataset(session=session, tenant_id=tenant.id, dataset_id=dataset_id)
    return dataset_public(found(ds, "Dataset"))


@router.delete(
    "/{dataset_id}", status_code=204, response_class=Response, responses=problems(404, 409)
)
def delete_dataset_route(
    dataset_id: str, session: SessionDep, settings: SettingsDep, tenant: TenantDep
) -> Response:
    """Delete the dataset and its file; 409 while a job that has not finished uses it."""
    ds = found(get_dataset(session=session, tenant_id=tenant.id, dataset_id=dataset_id), "Dataset")
    if dataset_in_use(session=session, tenant_id=tenant.id, dataset_id=ds.id):
        raise HTTPException(409, "A job that has not finished uses this dataset.")
    path = artifact_path(settings, ds.path)
    delete_dataset(session=session, dataset=ds)
    session.commit()
    if path is not None:
        path.unlink(missing_ok=True)
    return Response(status_code=204)
