"""Tenants: every row a user owns carries ``tenant_id``, and a request acts as the tenant of its
API key (docs/service.md#authentication-and-tenancy). A tenant is created on first use, when a
key is first made for it (``comera keys create --tenant NAME``; the admin key ``comera up``
prints belongs to ``default``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.db.models import Tenant
from service.store.ids import new_id

__all__ = ["get_or_create_tenant", "one_at_a_time"]

_SQLITE_LOCK = threading.Lock()  # the embedded store: one API process, requests on threads


def get_or_create_tenant(*, session: Session, name: str) -> Tenant:
    """The tenant called ``name``; created (and committed) if missing, race-safe."""
    tenant = session.scalars(select(Tenant).where(Tenant.name == name)).first()
    if tenant is not None:
        return tenant
    try:
        tenant = Tenant(id=new_id("ten"), name=name)
        session.add(tenant)
        session.commit()
        return tenant
    except IntegrityError:  # another request created it first
        session.rollback()
        return session.scalars(select(Tenant).where(Tenant.name == name)).one()


@contextmanager
def one_at_a_time(*, session: Session, tenant_id: str) -> Iterator[None]:
    """Run the block, which must end by committing, as the only such block of this tenant:
    a check-then-insert (the queued-jobs quota) that two concurrent requests would both pass.
    PostgreSQL: the tenant row locked ``FOR UPDATE`` until the block's commit (or rollback),
    across every API process. SQLite, which has no row locks: one process-wide lock around the
    block (the embedded store serves one process)."""
    if session.get_bind().dialect.name == "sqlite":
        with _SQLITE_LOCK:
            yield
        return
    session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
    yield
