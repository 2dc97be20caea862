"""API keys in the store: create (returning the plaintext once), look up by hash, list, revoke."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.store.auth import DEFAULT_SCOPES, Principal, new_key, validate_scopes
from service.store.db.crud.tenants import get_or_create_tenant
from service.store.db.models import ApiKey, Tenant, utcnow
from service.store.ids import new_id

__all__ = ["create_key", "has_active_key", "list_keys", "principal_for_hash", "revoke_key"]


def create_key(
    *, session: Session, tenant: str, scopes: Iterable[str] = DEFAULT_SCOPES
) -> tuple[ApiKey, str]:
    """A new key for tenant ``tenant`` (created if missing), committed; returns the row and
    the plaintext, which is stored nowhere. An unknown scope is a ``ValueError``."""
    checked = validate_scopes(scopes)
    owner = get_or_create_tenant(session=session, name=tenant)
    made = new_key()
    row = ApiKey(
        id=new_id("key"),
        tenant_id=owner.id,
        key_hash=made.key_hash,
        prefix=made.prefix,
        scopes=list(checked),
    )
    session.add(row)
    session.commit()
    return row, made.plaintext


def principal_for_hash(*, session: Session, key_hash: str) -> Principal | None:
    """The principal of an active key with this hash, or ``None``."""
    row = session.execute(
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    key, tenant_name = row
    return Principal(
        key_id=key.id,
        prefix=key.prefix,
        tenant_id=key.tenant_id,
        tenant_name=tenant_name,
        scopes=frozenset(key.scopes),
    )


def list_keys(*, session: Session, tenant_id: str | None = None) -> Sequence[ApiKey]:
    """Keys, newest first (of one tenant when ``tenant_id`` is given); hashes stay inside."""
    stmt = select(ApiKey).order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
    if tenant_id is not None:
        stmt = stmt.where(ApiKey.tenant_id == tenant_id)
    return session.scalars(stmt).all()


def revoke_key(*, session: Session, key_id: str, tenant_id: str | None = None) -> bool:
    """Revoke an active key (of ``tenant_id`` when given); ``False`` when there was none."""
    stmt = update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
    if tenant_id is not None:
        stmt = stmt.where(ApiKey.tenant_id == tenant_id)
    done = session.execute(stmt.values(revoked_at=utcnow())).rowcount
    session.commit()
    return bool(done)


def has_active_key(*, session: Session) -> bool:
    found = session.scalars(select(ApiKey.id).where(ApiKey.revoked_at.is_(None)).limit(1))
    return found.first() is not None
