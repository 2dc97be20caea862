"""Idempotent submission (docs/service.md#idempotency): ``Idempotency-Key`` on ``POST /v1/jobs``.

The store keeps (tenant, key) -> the sha256 of the normalized body and the first response,
for 24 hours. A repeat with the same body replays that response; with another body it is a
422; while the first request is still being processed it is a 409. A first request that
fails (any error answer) forgets its key, so the client may try again with the same one.
Expired rows are removed by the reaper (:func:`purge_expired`, a bounded batch per pass), or
replaced when their key is used again.

A key left in flight longer than :data:`STALE_IN_FLIGHT` belongs to a request whose API
process died. The job id, written in the transaction that inserts the job
(:func:`link_job`), tells what happened: with a job, a retry replays it (``created``); without
one, nothing was stored and the retry takes the key over (``new``), one retry winning a race.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.db.models import IdempotencyKey, utcnow

__all__ = [
    "KEEP",
    "STALE_IN_FLIGHT",
    "Claim",
    "claim_key",
    "finish_key",
    "forget_key",
    "link_job",
    "purge_expired",
]

KEEP = timedelta(hours=24)
# longer than any submission can take (the planner gives up after 60 s)
STALE_IN_FLIGHT = timedelta(minutes=5)


@dataclass(frozen=True)
class Claim:
    """``new``: go ahead (the key is now in flight); ``replay``: the stored first response;
    ``created``: the first request created ``job_id`` and died before answering (answer with
    that job); ``conflict``: the first request is still running; ``mismatch``: another body."""

    outcome: str
    status_code: int | None = None
    response: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    job_id: str | None = None


def claim_key(*, session: Session, tenant_id: str, key: str, fingerprint: str) -> Claim:
    """Look the key up and, if it is free (or expired), take it; commits."""
    now = utcnow()
    row = session.get(IdempotencyKey, (tenant_id, key))
    if row is not None and _aware(row.expires_at) <= now:
        session.delete(row)
        session.flush()
        row = None
    if row is None:
        session.add(
            IdempotencyKey(
                tenant_id=tenant_id,
                key=key,
                fingerprint=fingerprint,
                state="in_flight",
                created_at=now,
                expires_at=now + KEEP,
            )
        )
        try:
            session.commit()
            return Claim("new")
        except IntegrityError:  # a concurrent request took it first
            session.rollback()
            row = session.scalars(select(IdempotencyKey).where(*_match(tenant_id, key))).one()
    session.commit()
    if row.fingerprint != fingerprint:
        return Claim("mismatch")
    if row.state == "done":
        return Claim("replay", row.status_code, row.response, row.headers)
    if _aware(row.created_at) > now - STALE_IN_FLIGHT:
        return Claim("conflict")
    if row.job_id is not None:
        return Claim("created", job_id=row.job_id)
    # abandoned before a job was stored: take the key over (compare-and-set on created_at)
    taken = session.execute(
        update(IdempotencyKey)
        .where(
            *_match(tenant_id, key),
            IdempotencyKey.state == "in_flight",
            IdempotencyKey.job_id.is_(None),
            IdempotencyKey.created_at == row.created_at,
        )
        .values(created_at=now, expires_at=now + KEEP)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.commit()
    return Claim("new") if taken == 1 else Claim("conflict")


def link_job(*, session: Session, tenant_id: str, key: str, job_id: str) -> None:
    """Record ``job_id`` on the in-flight key, in the caller's transaction (the one that
    inserts the job): no commit here."""
    q = update(IdempotencyKey).where(*_match(tenant_id, key)).values(job_id=job_id)
    session.execute(q.execution_options(synchronize_session=False))


def finish_key(
    *,
    session: Session,
    tenant_id: str,
    key: str,
    status_code: int,
    response: dict[str, Any],
    headers: dict[str, str],
) -> None:
    done = {"state": "done", "status_code": status_code, "response": response, "headers": headers}
    session.execute(update(IdempotencyKey).where(*_match(tenant_id, key)).values(**done))
    session.commit()


def forget_key(*, session: Session, tenant_id: str, key: str) -> None:
    session.rollback()
    in_flight = IdempotencyKey.state == "in_flight"
    session.execute(delete(IdempotencyKey).where(*_match(tenant_id, key), in_flight))
    session.commit()


def purge_expired(*, session: Session, now: datetime, limit: int) -> int:
    """Delete up to ``limit`` keys expired at ``now`` (oldest first); returns how many. The
    outer ``expires_at`` test keeps a key claimed again meanwhile (a fresh row) alive."""
    expired = IdempotencyKey.expires_at <= now
    oldest = (
        select(IdempotencyKey.tenant_id, IdempotencyKey.key)
        .where(expired)
        .order_by(IdempotencyKey.expires_at)
        .limit(limit)
    )
    pk = tuple_(IdempotencyKey.tenant_id, IdempotencyKey.key)
    q = delete(IdempotencyKey).where(pk.in_(oldest), expired)
    return session.execute(q.execution_options(synchronize_session=False)).rowcount


def _match(tenant_id: str, key: str) -> tuple[Any, Any]:
    return IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key


def _aware(t: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
