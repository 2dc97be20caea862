"""What the routes of a tenant's uploaded files (``/v1/datasets``, ``/v1/models``) share: the
raw request body's OpenAPI entry, the request's media type, their 404 and 400 answers, and the
list, read and delete routes (:func:`add_upload_routes`)."""

# no ``from __future__ import annotations``: FastAPI reads the annotations of the routes that
# add_upload_routes defines, which name its local variables

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path as FilePath
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel

from service.api.deps import SessionDep, SettingsDep, TenantDep
from service.errors import problems
from service.store.db.crud.uploads import UploadKind
from service.store.storage import artifact_path

__all__ = ["RAW_BODY", "add_upload_routes", "cursor_checked", "found", "media_type"]

T = TypeVar("T")

# the upload routes read the body themselves (streamed): OpenAPI learns of it from here
RAW_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def media_type(request: Request) -> str:
    """The request's ``Content-Type`` without its parameters, in lower case."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def found(row: T | None, what: str) -> T:
    """``row``; 404 ``"<what> not found."`` when there is none (or it is another tenant's)."""
    if row is None:
        raise HTTPException(404, f"{what} not found.")
    return row


@contextmanager
def cursor_checked() -> Iterator[None]:
    """A list call whose cursor does not decode (``ValueError``) answers 400."""
    try:
        yield
    except ValueError:
        raise HTTPException(400, "Invalid cursor.") from None


def add_upload_routes(
    router: APIRouter,
    *,
    kind: UploadKind[Any],
    noun: str,
    public: Callable[[Any], BaseModel],
    item: type[BaseModel],
    page: type[BaseModel],
    remove_files: Callable[[FilePath], None],
    files: str,
) -> None:
    """``GET ""`` (the tenant's uploads of ``kind``, newest first), ``GET /{<noun>_id}`` and
    ``DELETE /{<noun>_id}`` (409 while a job that has not finished uses the upload; then its
    row, then its ``files`` with ``remove_files``). ``public`` turns a row into ``item``;
    a page is ``page(items=..., next_cursor=...)``."""
    param, what = f"{noun}_id", noun.capitalize()
    UploadId = Annotated[str, Path(alias=param)]

    def list_route(
        session: SessionDep,
        tenant: TenantDep,
        cursor: Annotated[str | None, Query(max_length=512)] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> Any:
        with cursor_checked():
            rows, nxt = kind.page(session=session, tenant_id=tenant.id, cursor=cursor, limit=limit)
        return page(items=[public(r) for r in rows], next_cursor=nxt)

    def read_route(upload_id: UploadId, session: SessionDep, tenant: TenantDep) -> Any:
        row = kind.get(session=session, tenant_id=tenant.id, upload_id=upload_id)
        return public(found(row, what))

    def delete_route(
        upload_id: UploadId, session: SessionDep, settings: SettingsDep, tenant: TenantDep
    ) -> Response:
        row = found(kind.get(session=session, tenant_id=tenant.id, upload_id=upload_id), what)
        if kind.in_use(session=session, tenant_id=tenant.id, upload_id=row.id):
            raise HTTPException(409, f"A job that has not finished uses this {noun}.")
        path = artifact_path(settings, row.path)
        kind.delete(session=session, row=row)
        session.commit()
        if path is not None:
            remove_files(path)
        return Response(status_code=204)

    router.add_api_route(
        "",
        list_route,
        methods=["GET"],
        response_model=page,
        responses=problems(400, 422),
        name=f"list_{noun}s_route",
        description=f"The tenant's {noun}s, newest first.",
    )
    router.add_api_route(
        f"/{{{param}}}",
        read_route,
        methods=["GET"],
        response_model=item,
        responses=problems(404),
        name=f"read_{noun}",
    )
    router.add_api_route(
        f"/{{{param}}}",
        delete_route,
        methods=["DELETE"],
        status_code=204,
        response_class=Response,
        responses=problems(404, 409),
        name=f"delete_{noun}_route",
        description=(
            f"Delete the {noun} and its {files}; 409 while a job that has not finished uses it."
        ),
    )
