"""NUL (U+0000) in what a client sends: refused at the edge, the same on every store.

PostgreSQL's ``text`` and ``jsonb`` cannot hold U+0000 (the driver raises
``UntranslatableCharacter``: a label, a ``q`` filter or a job id holding one was a 500) while
SQLite stores it, so the two stores disagreed. No field of the API has a use for NUL, so a NUL
in any string a client sends is a 422 problem naming where it is, before any handler, query or
store sees it:

* the URL path, every query parameter (name and value, after percent-decoding: ``q=a%00``) and
  every header value: :class:`NulGuardMiddleware`, before authentication;
* JSON request bodies (every ``/v1/jobs`` body: submit, ``:validate``, ``PATCH``, cancel,
  retry): :func:`body_nul_errors`, called by ``service.request_body`` on the parsed document
  before the schema sees it; every key and every string value, at any depth, is looked at.

A body that holds no NUL costs one substring search of its bytes (JSON can only carry NUL as
the escape ``\\u0000``, or in a UTF-16/32 encoding, whose bytes always hold zero bytes).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from api_schemas import FieldError
from service.errors import MAX_ERRORS, FieldProblem, json_pointer, problem_response

__all__ = ["CODE", "NUL", "NulGuardMiddleware", "body_nul_errors", "nul_errors"]

NUL = "\x00"
CODE = "nul_character"
MESSAGE = "holds a NUL character (U+0000), which no field accepts"


def _shown(name: str) -> str:
    return name.replace(NUL, "\\u0000")[:200]


def nul_errors(document: Any, limit: int = MAX_ERRORS) -> tuple[list[FieldError], int]:
    """The first ``limit`` strings of a parsed JSON ``document`` holding NUL, in input order,
    by JSON Pointer (a key holding one: the pointer of its object), and how many there are."""
    errors: list[FieldError] = []
    total = 0
    stack: list[tuple[list[str | int], Any]] = [([], document)]
    while stack:
        parts, value = stack.pop()
        if isinstance(value, str):
            found = [(parts, MESSAGE)] if NUL in value else []
            children: list[tuple[list[str | int], Any]] = []
        elif isinstance(value, dict):
            found = [(parts, f"the key {_shown(k)!r} {MESSAGE}") for k in value if NUL in k]
            children = [([*parts, k], v) for k, v in value.items() if NUL not in k]
        elif isinstance(value, list):
            found, children = [], [([*parts, i], v) for i, v in enumerate(value)]
        else:
            continue
        for where, message in found:
            total += 1
            if len(errors) < limit:
                errors.append(FieldError(pointer=json_pointer(where), message=message, code=CODE))
        stack.extend(reversed(children))  # popped in input order
    return errors, total


def body_nul_errors(raw: bytes, document: Any) -> FieldProblem | None:
    """The 422 of a JSON body (``raw``, parsed: ``document``) holding NUL; None if none does."""
    if b"\\u0000" not in raw and b"\x00" not in raw:
        return None
    errors, total = nul_errors(document)
    return FieldProblem.invalid(errors, total) if errors else None


def _nul_parameter(scope: Scope) -> str | None:
    """What of the path, query and headers holds NUL (a parameter's name), or None."""
    if NUL in scope.get("path", ""):
        return "path"
    query: bytes = scope.get("query_string", b"")
    if b"%00" in query or b"\x00" in query:  # decoded as Starlette decodes it
        for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if NUL in name or NUL in value:
                return _shown(name)
    for name, value in scope.get("headers", ()):
        if b"\x00" in value:
            return name.decode("latin-1")
    return None


class NulGuardMiddleware:
    """Answers a request whose path, query or headers hold NUL with a 422 naming it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = _nul_parameter(scope) if scope["type"] == "http" else None
        if name is None:
            await self.app(scope, receive, send)
            return
        problem = FieldProblem.param(name, MESSAGE, CODE)
        response = problem_response(422, problem.detail, errors=problem.errors)
        await response(scope, receive, send)
