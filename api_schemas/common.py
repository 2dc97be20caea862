"""Wire types shared by every resource: RFC 9457 problem details and cursor pages."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FieldError", "HealthPublic", "Page", "Problem", "StrictModel"]

T = TypeVar("T")


class StrictModel(BaseModel):
    """Request bodies: unknown fields are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldError(BaseModel):
    """One failing field of a request: a JSON Pointer (RFC 6901) into the body or query."""

    pointer: str = Field(examples=["/schedule/1/target_ratio"])
    message: str
    code: str = Field(examples=["less_than_equal", "missing", "config"])
    parameter: str | None = Field(
        default=None,
        description="for a query, path or header parameter: its name (the pointer is then empty)",
        examples=["limit"],
    )


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = None


class Page(BaseModel, Generic[T]):
    """A cursor page: pass ``next_cursor`` back as ``cursor`` for the next one (null: done)."""

    items: list[T]
    next_cursor: str | None = None


class HealthPublic(BaseModel):
    """``/v1/healthz`` and ``/v1/readyz``: overall status and one entry per dependency."""

    status: str = Field(examples=["ok", "ready"])
    checks: dict[str, str] = Field(default_factory=dict, examples=[{"database": "ok"}])
