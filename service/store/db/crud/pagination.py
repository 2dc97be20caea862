"""Keyset pagination on ``(created_at, id)``, newest first, with opaque cursors.

A cursor is the URL-safe base64 of ``[created_at ISO 8601, id]`` of the last row of a page;
the next page holds the rows strictly after it in ``ORDER BY created_at DESC, id DESC``. Rows
inserted meanwhile never shift a page (unlike OFFSET), and a walk over all pages sees each row
once. A cursor that does not decode is a ``ValueError`` (the route answers 400).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute, Session

__all__ = ["as_utc", "decode_cursor", "encode_cursor", "keyset_page"]

T = TypeVar("T")


def as_utc(t: datetime) -> datetime:
    """SQLite returns naive datetimes (stored as UTC); make every timestamp aware."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def encode_cursor(created_at: datetime, row_id: str) -> str:
    raw = json.dumps([as_utc(created_at).isoformat(), row_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """``(created_at, id)`` of a cursor; ``ValueError`` when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, row_id = json.loads(raw)
        if not isinstance(stamp, str) or not isinstance(row_id, str):
            raise ValueError("cursor fields")
        return as_utc(datetime.fromisoformat(stamp)), row_id
    except (binascii.Error, UnicodeDecodeError, TypeError, ValueError) as err:
        raise ValueError(f"invalid cursor: {err}") from None


def keyset_page(
    *,
    session: Session,
    query: Select[Any],
    created: InstrumentedAttribute[Any],
    ident: InstrumentedAttribute[Any],
    cursor: str | None,
    limit: int,
) -> tuple[list[Any], str | None]:
    """One page of ``query`` (a ``select`` of one entity) and the cursor of the next one."""
    if cursor is not None:
        at, last = decode_cursor(cursor)
        query = query.where(or_(created < at, and_(created == at, ident < last)))
    rows = list(session.scalars(query.order_by(created.desc(), ident.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    if not more or not rows:
        return rows, None
    tail = rows[-1]
    return rows, encode_cursor(getattr(tail, created.key), getattr(tail, ident.key))
