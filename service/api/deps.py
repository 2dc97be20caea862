"""Dependencies of the route handlers, as ``Annotated`` aliases (the template's ``deps.py``).

``SessionDep``: one SQLAlchemy session per request (handlers commit explicitly).
``SettingsDep``: the app's ``Settings``. ``TenantDep``: who is asking; until API-key auth
(issue 6) replaces this one function, every request is the ``default`` tenant.
``EnqueueDep`` / ``RevokeDep``: the queue (``service.queue``, imported lazily so the API runs,
with every job ``enqueue_pending``, where the worker package is absent). ``PlannerDep``: the
dry-run planner (``service.planner``). Tests override these with ``app.dependency_overrides``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, HTTPException, Path, Request
from sqlalchemy.orm import Session

from service.core.config import Settings
from service.db.crud.jobs import get_job
from service.db.crud.tenants import get_or_create_tenant
from service.db.models import Job, Tenant
from service.planner import Planner
from service.submission import Enqueue

__all__ = ["EnqueueDep", "JobDep", "PlannerDep", "RevokeDep", "SessionDep", "SettingsDep",
           "TenantDep", "get_enqueue", "get_planner", "get_revoke", "get_session",
           "get_settings", "get_tenant", "get_tenant_job"]  # fmt: skip

log = logging.getLogger(__name__)
DEFAULT_TENANT = "default"


def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session per request. Creating one does no I/O, so this runs on the event loop
    (a sync dependency would cost a hop through the thread pool on every request)."""
    session = request.app.state.sessionmaker()
    try:
        yield session
    finally:
        session.close()  # returns the connection, if one was checked out


SessionDep = Annotated[Session, Depends(get_session)]


def _load_tenant(request: Request, name: str) -> Tenant:
    with request.app.state.sessionmaker() as session:
        tenant = get_or_create_tenant(session=session, name=name)
        session.expunge(tenant)  # detached, its columns loaded: safe to share
        return tenant


async def get_tenant(request: Request) -> Tenant:
    """The caller's tenant (issue 6: from the API key; for now always ``default``).

    Looked up once per process and cached (tenants are never renamed or removed while the
    API runs), so a request pays neither a query nor a thread-pool hop for it."""
    cache: dict[str, Tenant] = request.app.state.tenant_cache
    tenant = cache.get(DEFAULT_TENANT)
    if tenant is None:
        tenant = await anyio.to_thread.run_sync(_load_tenant, request, DEFAULT_TENANT)
        cache[DEFAULT_TENANT] = tenant
    return tenant


TenantDep = Annotated[Tenant, Depends(get_tenant)]


def get_tenant_job(job_id: Annotated[str, Path(max_length=64)], session: SessionDep,
                   tenant: TenantDep) -> Job:  # fmt: skip
    """The job named in the path; another tenant's job is a 404 too (b.6)."""
    job = get_job(session=session, job_id=job_id, tenant_id=tenant.id)
    # end the transaction (``expire_on_commit=False`` keeps the job loaded): no pooled
    # connection is held while the request waits for a thread to run its handler (admission
    # control, service.middleware, is what rules out the pool deadlock; this shortens holds)
    session.commit()
    if job is None:
        raise HTTPException(404, "Job not found.")
    return job


JobDep = Annotated[Job, Depends(get_tenant_job)]


def _queue() -> Any | None:
    try:
        return importlib.import_module("service.queue")
    except ImportError:
        log.warning("service.queue is not available: jobs stay enqueue_pending")
        return None


def _not_sent(**_: Any) -> bool:
    return False


def get_enqueue(settings: SettingsDep) -> Enqueue:
    queue = _queue()
    return _not_sent if queue is None else partial(queue.enqueue, settings=settings)


EnqueueDep = Annotated[Enqueue, Depends(get_enqueue)]


def _revoke(settings: Settings, task_id: str) -> None:
    queue = _queue()
    if queue is None:
        return
    try:
        queue.revoke(settings, task_id)
    except Exception:  # noqa: BLE001 (best effort: the claim check is the real guard)
        log.exception("revoke of %s failed", task_id)


def get_revoke(settings: SettingsDep) -> Callable[[str], None]:
    return partial(_revoke, settings)


RevokeDep = Annotated[Callable[[str], None], Depends(get_revoke)]


def get_planner(request: Request) -> Planner:
    return request.app.state.planner  # type: ignore[no-any-return]


PlannerDep = Annotated[Planner, Depends(get_planner)]
