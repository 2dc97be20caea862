"""Tenants: every row a user owns carries ``tenant_id``; until API keys exist (issue 6) every
request acts as the ``default`` tenant, created on first use."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.models import Tenant
from service.ids import new_id

__all__ = ["get_or_create_tenant"]


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
