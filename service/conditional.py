"""Conditional requests on jobs (RFC 9110 section 13): ``ETag``, ``If-None-Match`` (304) and
``If-Match`` (412 / 428 on PATCH).

The tag is ``W/"<version>.<updated>"``: ``version`` moves with every state or user change,
``updated`` (microseconds of ``updated_at``) with every progress flush of the worker, which
does not bump the version. So a cached representation is revalidated whenever anything in it
changed, while ``If-Match`` on PATCH compares the version part only: a PATCH of the name or
labels must not fail because the job took another training step. Both headers compare weakly.
"""

from __future__ import annotations

from datetime import datetime

__all__ = ["etag_matches", "job_etag", "version_matches"]


def job_etag(version: int, updated_at: datetime | None = None) -> str:
    stamp = 0 if updated_at is None else int(updated_at.timestamp() * 1_000_000)
    return f'W/"{version}.{stamp}"'


def _opaque(tag: str) -> str:
    tag = tag.strip()
    return (tag[2:] if tag.startswith("W/") else tag).strip('"')


def _tags(header: str | None) -> list[str]:
    return [] if header is None else [t.strip() for t in header.split(",") if t.strip()]


def etag_matches(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or is ``*``)."""
    return any(t == "*" or _opaque(t) == _opaque(etag) for t in _tags(header))


def version_matches(header: str | None, version: int) -> bool:
    """Whether an ``If-Match`` header names a tag of this job ``version`` (or is ``*``)."""
    return any(t == "*" or _opaque(t).split(".", 1)[0] == str(version) for t in _tags(header))
