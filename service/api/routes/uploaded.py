"""What the routes of a tenant's uploaded files (``/v1/datasets``, ``/v1/models``) share: the
raw request body's OpenAPI entry, the request's media type, and their 404 and 400 answers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from fastapi import HTTPException, Request

__all__ = ["RAW_BODY", "cursor_checked", "found", "media_type"]

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
