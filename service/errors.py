"""RFC 9457 problem details (``application/problem+json``) for every error the API returns.

Handlers raise ``HTTPException`` with a fixed ``detail`` string (the template's style); the
handlers here turn it into a problem object. A request that fails validation gets one 422
listing *every* failing field as ``{pointer, message, code}``, where ``pointer`` is a JSON
Pointer (RFC 6901) into the request body (``/schedule/1/target_ratio``); a failing query,
path or header parameter is named in ``parameter`` instead. ``FieldProblem`` is the same
shape for checks that run after parsing (dataset references, the engine's own validation).
A 422 lists at most ``MAX_ERRORS`` fields (the first, in input order); when more fail, the
problem's ``error_count`` gives how many and ``detail`` says so, so an error body stays small
whatever the request held. No problem names a server path: the data root, the artifact
directory and the home directory are cut out of every ``detail`` and message (files are then
named relative to the data root), whatever check wrote them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api_schemas import FieldError, Problem
from service.store import paths

__all__ = [
    "MAX_ERRORS",
    "PROBLEM_JSON",
    "FieldProblem",
    "field_errors",
    "install_error_handlers",
    "json_pointer",
    "problem_response",
    "problems",
]

PROBLEM_JSON = "application/problem+json"
MAX_ERRORS = 100  # failing fields listed in one problem
SHOWN_IN_DETAIL = 10  # of which named in its detail


class FieldProblem(HTTPException):
    """An HTTP error that names the failing fields of the request (``errors``); ``total``:
    how many fail in all, when ``errors`` lists only the first of them."""

    def __init__(
        self,
        status_code: int,
        detail: str,
        errors: Iterable[FieldError],
        headers: dict[str, str] | None = None,
        total: int | None = None,
    ) -> None:
        super().__init__(status_code=status_code, detail=detail, headers=headers)
        self.errors = list(errors)
        self.total = len(self.errors) if total is None else total

    @classmethod
    def one(cls, pointer: str, message: str, code: str = "invalid") -> FieldProblem:
        """A 422 for one field of the body."""
        err = FieldError(pointer=pointer, message=message, code=code)
        return cls(422, f"{pointer or 'body'}: {message}", [err])

    @classmethod
    def param(cls, name: str, message: str, code: str = "invalid") -> FieldProblem:
        """A 422 for one query, path or header parameter."""
        err = FieldError(pointer="", message=message, code=code, parameter=name)
        return cls(422, f"{name}: {message}", [err])

    @classmethod
    def invalid(cls, errors: list[FieldError], total: int) -> FieldProblem:
        """The 422 of a request that failed validation: ``errors`` (the first failing fields)
        of ``total``; the detail names the first ``SHOWN_IN_DETAIL``."""
        names = [e.pointer or e.parameter or "body" for e in errors[:SHOWN_IN_DETAIL]]
        more = f", and {total - len(names)} more" if total > len(names) else ""
        detail = f"{total} invalid field{'s' if total != 1 else ''}: {', '.join(names)}{more}"
        return cls(422, detail, errors, total=total)

    def extensions(self) -> dict[str, Any]:
        """Problem members beyond RFC 9457's: ``error_count`` when ``errors`` is cut short."""
        return {"error_count": self.total} if self.total > len(self.errors) else {}


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_response(
    status: int,
    detail: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    errors: list[FieldError] | None = None,
    instance: str | None = None,
    **extra: Any,
) -> JSONResponse:
    """A ``JSONResponse`` holding a problem object; ``extra`` become extension members."""
    body = Problem(
        title=_title(status),
        status=status,
        detail=detail,
        instance=instance,
        errors=errors,
        **extra,
    )
    content = body.model_dump(mode="json", exclude_none=True)
    return JSONResponse(content, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json errors for ``codes``."""
    return {
        code: {
            "model": Problem,
            "description": _title(code),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for code in codes
    }


def json_pointer(parts: Sequence[str | int]) -> str:
    """RFC 6901: ``("schedule", 1, "a/b")`` -> ``/schedule/1/a~1b``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _body_path(loc: Sequence[str | int], body: Any, missing: bool) -> list[str | int]:
    """The path of ``loc`` that exists in ``body``: pydantic adds union-member tags
    (``int``, ``list[...]``) and ``[key]`` markers that are not part of the document. Only a
    ``missing`` error may end in a member the body lacks."""
    path: list[str | int] = []
    cur = body
    for i, seg in enumerate(loc):
        if isinstance(cur, dict) and seg in cur:
            cur = cur[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cur):
            cur = cur[seg]
        elif not (missing and isinstance(cur, dict) and i == len(loc) - 1):
            continue  # a tag, not a member: skip it
        path.append(seg)
    return path


def _message(err: dict[str, Any]) -> str:
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def field_errors(
    errors: Iterable[Mapping[str, Any]], body: Any, limit: int = MAX_ERRORS
) -> tuple[list[FieldError], int]:
    """The first ``limit`` failing fields of FastAPI-style ``errors`` (``loc`` starting with
    ``body``, ``query``, ...; union alternatives merged), in input order, and how many fields
    fail in all."""
    merged: dict[tuple[str, str | None], FieldError] = {}
    beyond: set[tuple[str, str | None]] = set()
    for err in errors:
        loc = list(err.get("loc", ()))
        where, rest = (loc[0], loc[1:]) if loc else ("body", [])
        if where == "body":
            path = _body_path(rest, body, missing=err.get("type") == "missing")
            key = (json_pointer(path), None)
        else:
            key = ("", ".".join(str(p) for p in rest) or str(where))
        msg = _message(err)
        if key in merged:
            if msg not in merged[key].message:
                merged[key].message += f"; {msg}"
        elif len(merged) < limit:
            merged[key] = FieldError(
                pointer=key[0], message=msg, code=str(err.get("type", "")), parameter=key[1]
            )
        else:
            beyond.add(key)
    return list(merged.values()), len(merged) + len(beyond)


def _server_roots(request: Request) -> list[str]:
    """The app's server directories as a message may name them (``<dir>/``), longest first."""
    settings = getattr(request.app.state, "settings", None)
    if settings is None:
        return []
    roots = set()
    for root in (settings.data, settings.artifacts, settings.home):
        roots.add(f"{str(root).rstrip('/')}/")
        try:
            roots.add(f"{str(paths.resolve(Path(root))).rstrip('/')}/")
        except (OSError, ValueError):
            pass
    return sorted(roots - {"/"}, key=len, reverse=True)


def _without_roots(text: str, roots: list[str]) -> str:
    for root in roots:
        text = text.replace(root, "")
    return text


def _relative(request: Request, detail: str | None, errors: list[FieldError] | None) -> Any:
    """``detail`` and ``errors`` without the server's directories (module doc)."""
    roots = _server_roots(request)
    if detail is not None:
        detail = _without_roots(detail, roots)
    if errors:
        errors = [
            e.model_copy(update={"message": _without_roots(e.message, roots)}) for e in errors
        ]
    return detail, errors


async def _validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's own checks (query, path and header parameters; the ``/v1/jobs`` bodies are
    checked by ``service.request_body``, off the event loop)."""
    if any(e.get("type") == "json_invalid" for e in exc.errors()):
        err = FieldError(pointer="", message="the body is not valid JSON", code="json_invalid")
        return problem_response(400, "The request body is not valid JSON.", errors=[err])
    problem = FieldProblem.invalid(*field_errors(exc.errors(), exc.body))
    detail, errors = _relative(request, problem.detail, problem.errors)
    return problem_response(422, detail, errors=errors, **problem.extensions())


async def _http_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    errors = getattr(exc, "errors", None)
    detail = exc.detail if isinstance(exc.detail, str) else None
    detail, errors = _relative(request, detail, errors)
    extra = exc.extensions() if isinstance(exc, FieldProblem) else {}
    return problem_response(exc.status_code, detail, headers=exc.headers, errors=errors, **extra)


async def _database_down(request: Request, exc: OperationalError) -> JSONResponse:
    return problem_response(
        503, "The database is unavailable; nothing was stored.", headers={"Retry-After": "5"}
    )


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    return problem_response(500, "Internal server error.")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(Exception, _unhandled)
