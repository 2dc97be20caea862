"""From a validated ``JobCreate`` to a stored, enqueued job (``POST /v1/jobs``), and the dry run.

Order (docs/service.md#outbox-re-drive): every check first (the job prepared once by
:func:`service.store.prepare.prepare_job`: dataset references and model source resolved, the
spec translated; then the planner's model build), then the row is committed with the prepared,
versioned ``engine_config`` that the worker reads, and only then is the message sent. If
sending fails the job stays QUEUED with ``enqueue_pending`` and the reaper sends it later; the
client still gets its 202.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException
from sqlalchemy.orm import Session

from api_schemas import FieldError, JobCreate, JobState, ValidationReport
from service.errors import FieldProblem
from service.planner import (
    PlanFailed,
    PlannerBusy,
    PlannerUnavailable,
    PlanThrottled,
    TenantPlanner,
)
from service.store.db.crud.fair_queue import queued_wall_seconds
from service.store.db.crud.idempotency import link_job
from service.store.db.crud.job_actions import mark_enqueued
from service.store.db.crud.job_queries import count_jobs
from service.store.db.crud.jobs import create_job
from service.store.db.crud.tenants import one_at_a_time
from service.store.db.models import Job
from service.store.placement import placement
from service.store.prepare import PreparedJob, PrepareError, Roots, prepare_job
from service.store.settings import Settings
from service.store.spec import spec_hash

__all__ = ["Enqueue", "dispatch", "dry_run", "plan", "prepare", "submit"]

log = logging.getLogger(__name__)
Enqueue = Callable[..., bool]  # (job_id=, attempt=, max_wall_time_s=, devices=, nodes=) -> sent


def prepare(
    *, session: Session, settings: Settings, tenant_id: str, spec: JobCreate
) -> PreparedJob:
    """The prepared job of ``spec`` (:func:`service.store.prepare.prepare_job`: the dataset
    and the model source resolved, the spec translated once, planned as ``cpu`` unless it asks
    for ``cuda``); 422 naming the field."""
    roots = Roots.server(settings=settings, session=session, tenant_id=tenant_id)
    device = "cuda" if spec.training.device == "cuda" else "cpu"
    try:
        return prepare_job(spec, roots, device=device)
    except PrepareError as err:
        raise FieldProblem.one(err.pointer, err.message, err.code) from None


def plan(
    planner: TenantPlanner, prepared: PreparedJob, spec: JobCreate, *, required: bool
) -> dict[str, Any] | None:
    """The planner's report; 422 when the plan refuses the job, 429 past the tenant's share of
    the planner. Without a plan (the planner busy past the deadline, or unavailable): 503 with
    ``Retry-After``; a submission (``required`` false) is accepted unplanned only when the
    operator allows it (``COMERA_ACCEPT_UNPLANNED_JOBS``; the worker plans it again)."""
    try:
        return planner.plan(prepared, spec)
    except PlanFailed as err:
        raise FieldProblem.one(err.pointer, err.message, "config") from None
    except PlanThrottled as err:
        raise HTTPException(
            429, f"Too many plans at once: {err}.", headers={"Retry-After": str(err.retry_after)}
        ) from None
    except PlannerUnavailable as err:
        if not required and planner.accept_unplanned:
            log.warning("job accepted without a plan check: %s", err)
            return None
        busy = isinstance(err, PlannerBusy)
        detail = (
            f"The planner is busy ({err}); try again later."
            if busy
            else ("The planner is unavailable; try again later.")
        )
        raise HTTPException(503, detail, headers={"Retry-After": str(err.retry_after)}) from None


def dry_run(spec: JobCreate, report: dict[str, Any]) -> ValidationReport:
    """The dry-run answer: the normalized spec (defaults filled) and the planner's report."""
    return ValidationReport(spec=spec.model_dump(mode="json"), **report)


def dispatch(*, session: Session, job: Job, enqueue: Enqueue) -> Job:
    """Send the job's message (after its row is committed, to the queue of its placement)
    and record whether it went."""
    limits = (job.spec or {}).get("limits", {})
    try:
        sent = bool(
            enqueue(
                job_id=job.id,
                attempt=job.attempt,
                max_wall_time_s=int(limits.get("max_wall_time_s", 6 * 3600)),
                **placement(job.spec),
            )
        )
    except Exception:  # noqa: BLE001 (any broker failure: the reaper re-sends it)
        log.exception("enqueue of %s failed", job.id)
        sent = False
    mark_enqueued(session=session, job_id=job.id, sent=sent)
    session.commit()
    session.refresh(job)
    return job


def _check_queued_wall_time(
    *, session: Session, settings: Settings, tenant_id: str, spec: JobCreate
) -> None:
    """429 naming ``COMERA_MAX_QUEUED_WALL_SECONDS_PER_TENANT`` when this job's wall-time limit
    would take the tenant's QUEUED jobs past it (docs/service.md#limits)."""
    cap, wall = settings.max_queued_wall_seconds_per_tenant, spec.limits.max_wall_time_s
    queued = queued_wall_seconds(session=session, tenant_id=tenant_id)
    if queued + wall <= cap:
        return
    session.rollback()  # releases the tenant lock
    message = (
        f"{wall} s more would make this tenant's queued wall time {queued + wall} s, over "
        f"COMERA_MAX_QUEUED_WALL_SECONDS_PER_TENANT ({cap} s)"
    )
    raise FieldProblem(
        429,
        f"Too much queued wall time for this tenant: {message}.",
        [FieldError(pointer="/limits/max_wall_time_s", message=message, code="quota")],
        headers={"Retry-After": "60"},
    )


def submit(
    *,
    session: Session,
    settings: Settings,
    tenant_id: str,
    spec: JobCreate,
    engine_job: PreparedJob | dict[str, Any],
    enqueue: Enqueue,
    idempotency_key: str | None = None,
    message: str | None = None,
) -> Job:
    """Store the QUEUED job and its attempt 1, commit, then enqueue
    (docs/service.md#outbox-re-drive). The quota
    count and the insert run one request at a time per tenant, so concurrent submissions
    cannot queue more than ``max_queued_jobs_per_tenant``. The job id goes onto the
    in-flight ``idempotency_key`` in the same transaction (:func:`link_job`). The quota on
    the tenant's queued wall time (``max_queued_wall_seconds_per_tenant``) is checked under
    the same lock."""
    with one_at_a_time(session=session, tenant_id=tenant_id):
        queued = count_jobs(session=session, tenant_id=tenant_id, states=[JobState.QUEUED])
        if queued >= settings.max_queued_jobs_per_tenant:
            session.rollback()  # releases the tenant lock
            raise HTTPException(
                429, "Too many queued jobs for this tenant.", headers={"Retry-After": "60"}
            )
        _check_queued_wall_time(session=session, settings=settings, tenant_id=tenant_id, spec=spec)
        job = create_job(
            session=session,
            tenant_id=tenant_id,
            name=spec.name,
            labels=dict(spec.labels),
            spec=spec.model_dump(mode="json"),
            spec_hash=spec_hash(spec),
            max_attempts=spec.limits.max_attempts,
        )
        job.engine_config = (
            engine_job.engine_config if isinstance(engine_job, PreparedJob) else engine_job
        )
        if message:  # waiting_for_capacity (service.capacity)
            job.message = message
        if idempotency_key is not None:
            link_job(session=session, tenant_id=tenant_id, key=idempotency_key, job_id=job.id)
        session.commit()
    return dispatch(session=session, job=job, enqueue=enqueue)
