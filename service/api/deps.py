"""Dependencies of the route handlers, as ``Annotated`` aliases (the template's ``deps.py``).

``SessionDep``: one SQLAlchemy session per request (handlers commit explicitly).
``SettingsDep``: the app's ``Settings``. ``PrincipalDep``: who is asking, from the Bearer API
key (``service.auth``): 401 without a valid key, 403 without the scope the method needs, 429
past the key's rate limit; every ``/v1`` resource router depends on it. ``TenantDep``: the
principal's tenant. ``ArtifactsDep``: also demands ``artifacts:read``.
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
from fastapi import Depends, HTTPException, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.auth import KeyCache, Principal, hash_key, looks_like_key, required_scope
from service.core.config import Settings
from service.db.crud.api_keys import principal_for_hash
from service.db.crud.jobs import get_job
from service.db.models import Job, Tenant
from service.planner import Planner
from service.ratelimit import retry_after
from service.submission import Enqueue

__all__ = ["ArtifactsDep", "EnqueueDep", "JobDep", "PlannerDep", "PrincipalDep", "RevokeDep",
           "SessionDep", "SettingsDep", "TenantDep", "get_enqueue", "get_planner",
           "get_principal", "get_revoke", "get_session", "get_settings", "get_tenant",
           "get_tenant_job"]  # fmt: skip

log = logging.getLogger(__name__)


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
        try:
            session.close()  # returns the connection, if one was checked out
        except Exception:  # noqa: BLE001 (the database went away after the answer was sent:
            # raising here resets the client's connection; the pool discards this one)
            log.warning("a request's database connection was lost while closing it")


SessionDep = Annotated[Session, Depends(get_session)]


_bearer = HTTPBearer(auto_error=False, description="API key: `comera keys create --tenant NAME`")


def _lookup(request: Request, key_hash: str) -> Principal | None:
    with request.app.state.sessionmaker() as session:
        return principal_for_hash(session=session, key_hash=key_hash)


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": 'Bearer realm="comera"'})


async def get_principal(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Security(_bearer)]) -> Principal:  # fmt: skip
    """The caller, from ``Authorization: Bearer <key>``.

    A known key is cached per process for a short while (``service.auth.KeyCache``), so a
    request pays neither a query nor a thread-pool hop for it. The key itself is never
    logged or echoed, in errors neither."""
    if credentials is None:
        raise _unauthorized("An API key is required: Authorization: Bearer <key>.")
    key = credentials.credentials
    if not looks_like_key(key):
        raise _unauthorized("The API key is malformed.")
    key_hash = hash_key(key)
    cache: KeyCache = request.app.state.key_cache
    principal = cache.get(key_hash)
    if principal is None:
        principal = await anyio.to_thread.run_sync(_lookup, request, key_hash)
        if principal is None:
            raise _unauthorized("The API key is unknown or revoked.")
        cache.put(key_hash, principal)
    wait = await request.app.state.rate_limiter.take_async(principal.key_id)
    if wait > 0:
        raise HTTPException(429, "Too many requests for this API key; slow down.",
                            headers={"Retry-After": retry_after(wait)})  # fmt: skip
    scope = required_scope(request.method)
    if not principal.allows(scope):
        raise HTTPException(403, f"This API key lacks the scope {scope!r}.")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_tenant(principal: PrincipalDep) -> Tenant:
    """The caller's tenant: a detached row built from the principal (no query)."""
    return Tenant(id=principal.tenant_id, name=principal.tenant_name)


TenantDep = Annotated[Tenant, Depends(get_tenant)]


async def require_artifacts(principal: PrincipalDep) -> Principal:
    if not principal.allows("artifacts:read"):
        raise HTTPException(403, "This API key lacks the scope 'artifacts:read'.")
    return principal


ArtifactsDep = Depends(require_artifacts)


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
