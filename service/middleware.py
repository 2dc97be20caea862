"""ASGI middleware: admission control, the request body limit (docs/service.md#limits:
bodies up to ``max_body_bytes``, 1 MiB) and the guard that answers an unhandled error (below).

A declared ``Content-Length`` over the limit is refused before anything is read. A body sent
without one (chunked) is counted while the application reads it; past the limit the reader
sees a disconnect and whatever the application answers is replaced by the 413 problem. The
dataset upload route streams to disk with its own, larger limit and is exempt.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import problem_response

__all__ = [
    "AdmissionMiddleware",
    "BodyLimitMiddleware",
    "ServerErrorGuard",
    "content_length_exceeds",
    "long_transfer",
]

log = logging.getLogger(__name__)


_DIGITS = re.compile(r"[0-9]+")


def _too_large(limit: int) -> JSONResponse:
    return problem_response(413, f"The request body exceeds {limit} bytes.")


def content_length_exceeds(declared: bytes | str, limit: int) -> bool:
    """Whether a ``Content-Length`` of ASCII digits is over ``limit``. Any number of digits
    is read (Python refuses to convert more than 4,300, and 20 exceed every limit); anything
    else (``str.isdigit`` also takes a latin-1 superscript) is left to the server."""
    text = declared.decode("latin-1") if isinstance(declared, bytes) else declared
    if _DIGITS.fullmatch(text) is None:
        return False
    digits = text.lstrip("0")
    return len(digits) > 19 or int(digits or "0") > limit


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        exempt: Callable[[str, str], bool] = lambda method, path: False,
    ) -> None:
        self.app, self.max_bytes, self.exempt = app, max_bytes, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exempt(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and content_length_exceeds(declared, self.max_bytes):
            await _too_large(self.max_bytes)(scope, receive, send)
            return
        seen = 0
        exceeded = started = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _too_large(self.max_bytes)(scope, receive, send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await _too_large(self.max_bytes)(scope, receive, send)


class AdmissionMiddleware:
    """At most ``limit`` requests inside the application at once; the rest wait here.

    A request can hold a pooled database connection from its first query until its session
    closes after the response, and in between FastAPI hops through the thread pool (the
    handler, then response validation). With more requests in flight than connections, the
    threads end up waiting for connections held by requests that wait for threads: the pool
    times out. Admitting no more requests than the pool has connections rules that out; the
    waiting costs nothing but a place in an asyncio queue. Long transfers that hold no
    connection (event streams, file downloads, uploads) are not counted.
    """

    def __init__(
        self, app: ASGIApp, *, limit: int, exempt: Callable[[Scope], bool] = lambda scope: False
    ) -> None:
        self.app, self.exempt = app, exempt
        self.slots = asyncio.Semaphore(limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exempt(scope):
            await self.app(scope, receive, send)
            return
        async with self.slots:
            await self.app(scope, receive, send)


def long_transfer(scope: Scope) -> bool:
    """Event streams, checkpoint downloads, dataset and model uploads (AdmissionMiddleware)."""
    path, method = scope["path"], scope["method"]
    accept = dict(scope["headers"]).get(b"accept", b"")
    return (
        b"text/event-stream" in accept
        or path.endswith("/content")
        or (method == "POST" and path.rstrip("/").endswith(("/datasets", "/models")))
    )


class ServerErrorGuard:
    """Answers an exception no handler took with the 500 problem and keeps the connection.

    Starlette's outermost middleware sends that 500 through the app's handler and then
    re-raises, and uvicorn closes a connection whose application raised after its response
    began: the client's next request on the kept-alive connection was reset. Installed as
    the outermost middleware of the app, this logs the error and sends the problem itself,
    so nothing is raised past it; only a response already under way (its start sent, the
    body cut short) still raises, since that connection cannot be reused.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            if started:
                raise
            await problem_response(500, "Internal server error.")(scope, receive, send)
