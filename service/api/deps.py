"""Dependencies of the route handlers, as ``Annotated`` aliases (the template's ``deps.py``).

``SessionDep``: one SQLAlchemy session per request (handlers commit explicitly).
``SettingsDep``: the app's ``Settings``. ``PrincipalDep``: who is asking, from the Bearer API
key (``service.store.auth``): 401 without a valid key (429 after too many such failures from one
address), 403 without the scope the method needs, 429 past the key's rate limit; every
``/v1`` resource router depends on it. ``TenantDep``: the principal's tenant.
``ArtifactsDep``: also demands ``artifacts:read``.
``EnqueueDep`` / ``RevokeDep``: the queue (``service.store.queue``, imported lazily so the API runs,
with every job ``enqueue_pending``, where the worker package is absent). ``PlannerDep``: the
planner as the caller's tenant uses it (``service.planner.TenantPlanner``). Tests override
these with ``app.dependency_overrides``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, HTTPException, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.planner import PlanThrottled, TenantPlanner
from service.ratelimit import RateLimiter, retry_after
from service.store.auth import KeyCache, Principal, hash_key, looks_like_key, required_scope
from service.store.db.crud.api_keys import principal_for_hash
from service.store.db.crud.jobs import get_job
from service.store.db.models import Job, Tenant
from service.store.settings import Settings
from service.store.workers import process_baseline
from service.submission import Enqueue

__all__ = [
    "ArtifactsDep",
    "EnqueueDep",
    "JobDep",
    "PlannerDep",
    "PrincipalDep",
    "RevokeDep",
    "SessionDep",
    "SettingsDep",
    "TenantDep",
    "get_enqueue",
    "get_planner",
    "get_principal",
    "get_revoke",
    "get_session",
    "get_settings",
    "get_tenant",
    "get_tenant_job",
    "warm_queue",
]

log = logging.getLogger(__name__)


def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(get_settings)]


def _close(session: Session) -> None:
    try:
        session.close()  # returns the connection, if one was checked out
    except Exception:  # noqa: BLE001 (the database went away after the answer was sent:
        # raising here resets the client's connection; the pool discards this one)
        log.warning("a request's database connection was lost while closing it")


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session per request. Creating one does no I/O, so this runs on the event loop
    (a sync dependency would cost a hop through the thread pool on every request). Closing
    one that is still in a transaction is a ROLLBACK, a round trip to the database: that runs
    in the thread pool, never on the event loop (where it held up every other request: a
    fifth of the loop's time under polling, ``bench.api_load``)."""
    session = request.app.state.sessionmaker()
    try:
        yield session
    finally:
        if session.in_transaction():
            await anyio.to_thread.run_sync(_close, session)
        else:
            _close(session)


SessionDep = Annotated[Session, Depends(get_session)]


_bearer = HTTPBearer(auto_error=False, description="API key: `comera keys create --tenant NAME`")


def _lookup(request: Request, key_hash: str) -> Principal | None:
    with request.app.state.sessionmaker() as session:
        return principal_for_hash(session=session, key_hash=key_hash)


def _too_many_failures(wait: float) -> HTTPException:
    return HTTPException(
        429,
        "Too many failed authentications from this address; slow down.",
        headers={"Retry-After": retry_after(wait)},
    )


def _refused(request: Request, detail: str) -> HTTPException:
    """401, or 429 once this client address has failed too often (``auth_failures``)."""
    wait = _auth_failures(request).take(_address(request))
    if wait > 0:
        return _too_many_failures(wait)
    return HTTPException(401, detail, headers={"WWW-Authenticate": 'Bearer realm="comera"'})


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else "?"


def _auth_failures(request: Request) -> RateLimiter:
    """This process's failed-authentication buckets, one per client address."""
    state = request.app.state
    limiter: RateLimiter | None = getattr(state, "auth_failures", None)
    if limiter is None:
        settings: Settings = state.settings
        limiter = state.auth_failures = RateLimiter(
            settings.auth_failures_per_minute, settings.auth_failure_burst
        )
    return limiter


async def get_principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> Principal:
    """The caller, from ``Authorization: Bearer <key>``.

    A known key is cached per process for a short while (``service.store.auth.KeyCache``), so a
    request pays neither a query nor a thread-pool hop for it; an unknown one too, more
    briefly. Failed authentication is limited per client address (429 past
    ``auth_failures_per_minute``; an address over it gets no lookup in the store). The key
    itself is never logged or echoed, in errors neither."""
    if credentials is None:
        raise _refused(request, "An API key is required: Authorization: Bearer <key>.")
    key = credentials.credentials
    if not looks_like_key(key):
        raise _refused(request, "The API key is malformed.")
    key_hash = hash_key(key)
    cache: KeyCache = request.app.state.key_cache
    principal = cache.get(key_hash)
    if principal is None:
        if (wait := _auth_failures(request).peek(_address(request))) > 0:
            raise _too_many_failures(wait)
        if not cache.missing(key_hash):
            principal = await anyio.to_thread.run_sync(_lookup, request, key_hash)
        if principal is None:
            cache.put_missing(key_hash)
            raise _refused(request, "The API key is unknown or revoked.")
        cache.put(key_hash, principal)
    wait = await request.app.state.rate_limiter.take_async(principal.key_id)
    if wait > 0:
        raise HTTPException(
            429,
            "Too many requests for this API key; slow down.",
            headers={"Retry-After": retry_after(wait)},
        )
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


def get_tenant_job(
    job_id: Annotated[str, Path(max_length=64)], session: SessionDep, tenant: TenantDep
) -> Job:
    """The job named in the path; another tenant's job is a 404 too
    (docs/service.md#authentication-and-tenancy)."""
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
        return importlib.import_module("service.store.queue")
    except ImportError:
        log.warning("service.store.queue is not available: jobs stay enqueue_pending")
        return None


def warm_queue() -> None:
    """Import ``service.store.queue`` now (Celery's import costs the first submission ~1 s)."""
    _queue()


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


async def get_planner(request: Request, tenant: TenantDep, session: SessionDep) -> TenantPlanner:
    """The app's planner as this tenant uses it: its share of the planner processes, the
    request's deadline and the worker's memory capacity (``service.planner``). A tenant
    whose plans are at their limit gets its 429 here, before its body is read or the store
    touched (a refused submission would otherwise cost nearly what an accepted one does)."""
    settings: Settings = request.app.state.settings
    planner = TenantPlanner(
        planner=request.app.state.planner,
        tenant=tenant.id,
        per_tenant=settings.plans_per_tenant,
        queue_per_tenant=settings.plan_queue_per_tenant,
        timeout_s=settings.plan_timeout_seconds,
        capacity_bytes=settings.worker_memory_bytes,
        accept_unplanned=settings.accept_unplanned_jobs,
    )
    try:
        planner.check_turn()
    except PlanThrottled as err:
        raise HTTPException(
            429, f"Too many plans at once: {err}.", headers={"Retry-After": str(err.retry_after)}
        ) from None
    # what the workers measured for a job's process (service.store.workers), else the default
    baseline = await anyio.to_thread.run_sync(
        partial(process_baseline, session=session, settings=settings)
    )
    return replace(planner, baseline=baseline)


PlannerDep = Annotated[TenantPlanner, Depends(get_planner)]
