"""JSON request bodies parsed and validated off the event loop, with bounded error lists.

FastAPI parses a JSON body and validates it on the event loop, before the endpoint runs, and
with the GIL held throughout (a thread would not help): on this project's 2-core host 1 MiB
of ``[]`` took 0.8 s to parse, and 40,000 bad label keys 0.05 s to validate and 0.4 s to list
as errors, while every other request of the process waited. The ``/v1/jobs`` routes
therefore use :class:`DeferredBodyRoute`:

* a route declares its body as ``Deferred[Model]``: FastAPI documents ``Model`` as before
  but hands the endpoint a :class:`RawBody`, the bytes as received;
* the endpoint (a plain ``def``, so it runs in the thread pool) calls :func:`parse_body`. A
  body of at most ``SMALL_BODY_BYTES`` is parsed and validated in that thread (a few
  milliseconds at most, measured with hostile bodies); a larger one is checked first in a
  child process (spawned on first use, shared by every app of the process), so the API
  process never spends the GIL on it, and is parsed here only once the child found it valid
  (the schema bounds every list and map, so a valid body is cheap to parse);
* a body holding NUL (U+0000) anywhere is a 422 naming each such string
  (:mod:`service.nul_guard`), whatever else it holds;
* an invalid body is a 422 listing the first ``service.errors.MAX_ERRORS`` failing fields by
  JSON Pointer, with ``error_count`` when more fail; a body that is not JSON (or nests more
  than ``service.store.json_limits.MAX_DEPTH`` levels) is a 400. A child that takes longer than
  ``CHILD_TIMEOUT_S`` is killed and the request answered 503 with ``Retry-After``.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache
from typing import Annotated, Any, TypeVar

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError, WrapValidator

from api_schemas import FieldError
from service.errors import FieldProblem, field_errors
from service.nul_guard import body_nul_errors, nul_errors
from service.process_pools import kill_pool
from service.store import json_limits

__all__ = [
    "CHILD_TIMEOUT_S",
    "SMALL_BODY_BYTES",
    "Deferred",
    "DeferredBodyRoute",
    "RawBody",
    "parse_body",
]

SMALL_BODY_BYTES = 4096
CHILD_TIMEOUT_S = 30.0
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class RawBody:
    """A JSON request body as received, not yet parsed."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


# documented as T in OpenAPI, handed over as received (a RawBody) by DeferredBodyRoute
Deferred = Annotated[T, WrapValidator(lambda value, _handler: value)]


class _DeferredRequest(Request):
    async def json(self) -> Any:
        return RawBody(await self.body())


class DeferredBodyRoute(APIRoute):
    """A route whose JSON body FastAPI neither parses nor validates (see the module doc)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def deferred(request: Request) -> Response:
            return await handler(_DeferredRequest(request.scope, request.receive))

        return deferred


@lru_cache(maxsize=32)
def _adapter(model: type[BaseModel], optional: bool) -> TypeAdapter[Any]:
    return TypeAdapter(model | None if optional else model)


def _at_body(err: ValidationError) -> Iterator[dict[str, Any]]:
    """pydantic's errors as FastAPI reports a body's (``loc`` from ``body``), without the
    input and context members (listing them costs several times as much per error)."""
    for e in err.errors(include_url=False, include_context=False, include_input=False):
        yield {**e, "loc": ("body", *e["loc"])}


def _not_json(err: ValueError | RecursionError) -> HTTPException:
    reason = str(err) if isinstance(err, json_limits.JsonTooDeep) else "not valid JSON"
    error = FieldError(pointer="", message=f"the body is {reason}", code="json_invalid")
    return FieldProblem(400, "The request body is not valid JSON.", [error])


def _validate(model: type[BaseModel], optional: bool, data: bytes) -> Any:
    """The validated body; the 400 / 422 ``FieldProblem`` otherwise (bounded work per error)."""
    try:
        value = json_limits.loads(data)
    except (ValueError, RecursionError) as err:
        raise _not_json(err) from None
    nul = body_nul_errors(data, value)  # PostgreSQL holds no NUL: refused on every store
    if nul is not None:
        raise nul
    try:
        return _adapter(model, optional).validate_python(value)
    except ValidationError as err:
        raise FieldProblem.invalid(*field_errors(_at_body(err), value)) from None


def _check_in_child(model: type[BaseModel], optional: bool, data: bytes) -> dict[str, Any]:
    """Runs in the child: never raises (the problem travels as plain data)."""
    try:
        _validate(model, optional, data)
    except FieldProblem as problem:
        errors = [e.model_dump() for e in problem.errors]
        return {"status": problem.status_code, "errors": errors, "total": problem.total}
    return {"status": 200}


def _child_init() -> None:
    """Child initializer: run at a lower priority than the API process (a core busy with a
    hostile body must not slow the event loop down) and exit as soon as the API process is
    gone, however it ended."""
    os.nice(10)
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns once the parent's sentinel closes: it has exited
        os._exit(0)

    threading.Thread(target=watch, name="body-check-parent-watch", daemon=True).start()


class _Child:
    """One spawned process running :func:`_check_in_child`; thread-safe."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def check(self, model: type[BaseModel], optional: bool, data: bytes) -> dict[str, Any]:
        with self._lock:
            if self._pool is None:
                context = mp.get_context("spawn")
                self._pool = ProcessPoolExecutor(1, context, initializer=_child_init)
            pool = self._pool
        try:
            return pool.submit(_check_in_child, model, optional, data).result(CHILD_TIMEOUT_S)
        except (FutureTimeout, Exception):  # noqa: BLE001 (slow, died, or never started)
            self.close()
            raise HTTPException(
                503,
                "The request body could not be checked; try again later.",
                headers={"Retry-After": "30"},
            ) from None

    def close(self) -> None:
        """Stop the child now (killed: it may be stuck on a body)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            kill_pool(pool)


_child = _Child()
atexit.register(_child.close)


def parse_body(model: type[M], raw: Any, *, optional: bool = False) -> Any:
    """The ``model`` (or None, if ``optional``) of a ``Deferred`` body, validated in this
    thread (and first in the child when larger than ``SMALL_BODY_BYTES``); raises the 400 /
    422 ``FieldProblem`` (or 503 when the child fails). Call it from a ``def`` endpoint."""
    if not isinstance(raw, RawBody):  # no body, or not sent as JSON: one error at most
        errors, total = nul_errors(raw)
        if errors:
            raise FieldProblem.invalid(errors, total)
        try:
            return _adapter(model, optional).validate_python(raw)
        except ValidationError as err:
            raise FieldProblem.invalid(*field_errors(_at_body(err), raw)) from None
    if len(raw.data) > SMALL_BODY_BYTES:
        out = _child.check(model, optional, raw.data)
        if out["status"] != 200:
            errors = [FieldError(**e) for e in out["errors"]]
            if out["status"] == 400:
                raise FieldProblem(400, "The request body is not valid JSON.", errors)
            raise FieldProblem.invalid(errors, out["total"])
    return _validate(model, optional, raw.data)
