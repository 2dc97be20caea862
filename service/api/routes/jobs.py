"""``/v1/jobs``: submit, dry-run, list, read, relabel, cancel, retry, delete, attempts.

Handlers stay thin: checks and stores live in ``service.submission`` and ``service.store.db.crud``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from api_schemas import (
    TERMINAL_STATES,
    AttemptsPublic,
    CancelRequest,
    JobCreate,
    JobPublic,
    JobsPublic,
    JobState,
    JobUpdate,
    RetryRequest,
    ValidationReport,
)
from service.api.deps import (
    EnqueueDep,
    JobDep,
    PlannerDep,
    PrincipalDep,
    RevokeDep,
    SessionDep,
    SettingsDep,
    TenantDep,
)
from service.capacity import check_capacity
from service.conditional import etag_matches, job_etag, version_matches
from service.errors import FieldProblem, problems
from service.request_body import Deferred, DeferredBodyRoute, parse_body
from service.store.db.crud.idempotency import claim_key, finish_key, forget_key
from service.store.db.crud.job_actions import (
    cancel_job,
    delete_job,
    resolve_resume,
    retry_job,
    update_job,
)
from service.store.db.crud.job_queries import JobFilter, latest_metrics, list_attempts, list_jobs
from service.store.db.crud.jobs import get_job
from service.store.spec import spec_hash
from service.store.storage import remove_artifacts
from service.submission import dispatch, dry_run, plan, prepare, submit
from service.views import attempt_public, job_public

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=DeferredBodyRoute)
LABEL = re.compile(r"^([\w.\-/]{1,64}):(.{0,256})$")


class JobListParams(BaseModel):
    state: str | None = Field(None, description="comma list of states", examples=["RUNNING"])
    label: list[str] = Field([], description="k:v, repeatable (all must match)")
    q: str | None = Field(None, max_length=128, description="substring of the name")
    model: str | None = Field(None, max_length=32, description="architecture (spec.model.arch)")
    created_after: datetime | None = None
    created_before: datetime | None = None
    cursor: str | None = Field(None, max_length=512)
    limit: int = Field(50, ge=1, le=200)

    def to_filter(self) -> JobFilter:
        states = [s.strip() for s in (self.state or "").split(",") if s.strip()]
        if bad := [s for s in states if s not in JobState.__members__]:
            raise FieldProblem.param(
                "state", f"unknown state(s) {bad}; one of {[s.value for s in JobState]}"
            )
        labels = {}
        for item in self.label:
            if (m := LABEL.match(item)) is None:
                raise FieldProblem.param("label", f"{item!r} is not key:value")
            labels[m[1]] = m[2]
        return JobFilter(
            states=[JobState(s) for s in states],
            labels=labels,
            q=self.q,
            model=self.model,
            created_after=self.created_after,
            created_before=self.created_before,
        )


def _with_metrics(session: Any, job: Any) -> JobPublic:
    latest = latest_metrics(session=session, tenant_id=job.tenant_id, job_ids=[job.id])
    return job_public(job, latest[job.id])


@router.post(
    "", status_code=202, response_model=JobPublic, responses=problems(400, 413, 422, 429, 503)
)
def submit_job(
    spec: Deferred[JobCreate],
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
    planner: PlannerDep,
    enqueue: EnqueueDep,
    response: Response,
    idempotency_key: Annotated[
        str,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description=(
                "required (docs/service.md#idempotency): a new random value per job, reused "
                "only to retry"
            ),
        ),
    ],
) -> Any:
    """Store a QUEUED job (attempt 1) and enqueue it; 202 with ``Location``.

    Checked first: the body, dataset references, the engine translation, a registered worker
    for the job's placement (:mod:`service.capacity`: 422 when the registered workers cannot
    run it; accepted ``waiting_for_capacity`` when none has registered yet) and the plan (the
    model build, the data's real sizes, the memory estimate against the worker's capacity;
    :mod:`service.planner`: 429 past the tenant's share of the planner, 503 with
    ``Retry-After`` when no plan could be made in time). A broker outage still gives 202, with
    ``enqueue_pending`` set: the reaper sends the job later. ``Idempotency-Key`` is required
    (:mod:`service.store.db.crud.idempotency`): the same key and body replay the first answer
    (``Idempotent-Replayed: true``), another body is a 422, a first request still running 409."""
    spec = parse_body(JobCreate, spec)  # off the event loop (service.request_body)
    tenant_id, key = tenant.id, idempotency_key
    claim = claim_key(session=session, tenant_id=tenant_id, key=key, fingerprint=spec_hash(spec))
    if claim.outcome == "replay":
        return JSONResponse(
            claim.response,
            status_code=claim.status_code or 202,
            headers={**(claim.headers or {}), "Idempotent-Replayed": "true"},
        )
    if claim.outcome == "mismatch":
        raise HTTPException(422, "This Idempotency-Key was used with a different body.")
    if claim.outcome == "conflict":
        raise HTTPException(409, "A request with this Idempotency-Key is still running.")
    if claim.outcome == "created":  # the first request stored its job, then its process died
        job = get_job(session=session, tenant_id=tenant_id, job_id=claim.job_id or "")
        if job is None:
            raise HTTPException(409, "This Idempotency-Key's job was created and deleted since.")
        response.headers["Idempotent-Replayed"] = "true"
    else:
        try:
            engine_job = prepare(session=session, settings=settings, tenant_id=tenant_id, spec=spec)
            waiting = check_capacity(session=session, settings=settings, spec=spec)
            session.rollback()  # hand the connection back to the pool while the planner works
            plan(planner, engine_job, spec, required=False)
            job = submit(
                session=session,
                settings=settings,
                tenant_id=tenant_id,
                spec=spec,
                engine_job=engine_job,
                enqueue=enqueue,
                idempotency_key=key,
                message=waiting,
            )
        except Exception:
            forget_key(session=session, tenant_id=tenant_id, key=key)  # a failed one forgets it
            raise
    headers = {"Location": f"/v1/jobs/{job.id}", "ETag": job_etag(job.version, job.updated_at)}
    public = job_public(job)
    finish_key(
        session=session,
        tenant_id=tenant_id,
        key=key,
        status_code=202,
        response=public.model_dump(mode="json"),
        headers=headers,
    )
    response.headers.update(headers)
    return public


@router.post(
    ":validate", response_model=ValidationReport, responses=problems(400, 413, 422, 429, 503)
)
def validate_job(
    spec: Deferred[JobCreate],
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
    planner: PlannerDep,
) -> ValidationReport:
    """Dry run: the normalized spec and what the worker would build (per-layer shapes, modes
    and initial ranks; parameters before and after; estimated training memory: parameters x
    16 bytes (fp32 weight, gradient, two Adam moments), activations and the data held in
    memory, from the data's real sizes, within the worker's capacity; total steps when
    known). Nothing is stored or queued."""
    spec = parse_body(JobCreate, spec)
    engine_job = prepare(session=session, settings=settings, tenant_id=tenant.id, spec=spec)
    check_capacity(session=session, settings=settings, spec=spec)
    session.rollback()  # no connection held while the planner works
    return dry_run(spec, plan(planner, engine_job, spec, required=True) or {})


@router.get("", response_model=JobsPublic, responses=problems(400, 422))
def list_jobs_route(
    params: Annotated[JobListParams, Query()], session: SessionDep, tenant: TenantDep
) -> JobsPublic:
    """The tenant's jobs, newest first; pass ``next_cursor`` back as ``cursor``."""
    try:
        jobs, cursor = list_jobs(
            session=session,
            tenant_id=tenant.id,
            where=params.to_filter(),
            cursor=params.cursor,
            limit=params.limit,
        )
    except ValueError:
        raise HTTPException(400, "Invalid cursor.") from None
    latest = latest_metrics(session=session, tenant_id=tenant.id, job_ids=[j.id for j in jobs])
    return JobsPublic(items=[job_public(j, latest[j.id]) for j in jobs], next_cursor=cursor)


@router.head(
    "/{job_id}",
    response_model=JobPublic,
    responses={304: {"description": "Not modified (If-None-Match)"}, **problems(404)},
)
@router.get(
    "/{job_id}",
    response_model=JobPublic,
    responses={304: {"description": "Not modified (If-None-Match)"}, **problems(404)},
)
def read_job(
    job: JobDep,
    session: SessionDep,
    response: Response,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Any:
    """The job; an ``ETag`` (:mod:`service.conditional`), ``Retry-After`` while not finished.
    ``HEAD`` gives the same headers without the body (``jobs:read``)."""
    headers = {"ETag": job_etag(job.version, job.updated_at)}
    if JobState(job.state) not in TERMINAL_STATES:
        headers["Retry-After"] = "5"
    if etag_matches(if_none_match, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    response.headers.update(headers)
    return _with_metrics(session, job)


@router.patch(
    "/{job_id}", response_model=JobPublic, responses=problems(400, 404, 412, 413, 422, 428)
)
def update_job_route(
    job: JobDep,
    body: Deferred[JobUpdate],
    session: SessionDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> JobPublic:
    """Change the name and/or labels; requires ``If-Match`` with the job's ETag."""
    body = parse_body(JobUpdate, body)
    if if_match is None:
        raise HTTPException(428, "If-Match is required: send the job's ETag.")
    if not version_matches(if_match, job.version):
        raise HTTPException(412, "The job has changed: its ETag does not match If-Match.")
    changes = body.model_dump(exclude_none=True)
    if changes:
        job = update_job(session=session, job=job, version=job.version, changes=changes)
        if job is None:
            raise HTTPException(412, "The job has changed: its ETag does not match If-Match.")
        session.commit()
    response.headers["ETag"] = job_etag(job.version, job.updated_at)
    return _with_metrics(session, job)


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobPublic,
    responses={
        200: {"model": JobPublic, "description": "Cancelled (or already)"},
        **problems(400, 404, 409, 413, 422),
    },
)
def cancel_job_route(
    job: JobDep,
    session: SessionDep,
    revoke: RevokeDep,
    response: Response,
    body: Deferred[CancelRequest | None] = None,
) -> JobPublic:
    """QUEUED: cancelled at once (200). STARTING / RUNNING: CANCELLING, the worker checkpoints
    and stops (202); already CANCELLING: 202; already CANCELLED: 200; finished: 409."""
    body = parse_body(CancelRequest, body, optional=True) or CancelRequest()
    outcome, job = cancel_job(
        session=session, job=job, mode=body.mode, save_partial=body.save_partial
    )
    if outcome == "finished":
        raise HTTPException(409, "The job has already finished.")
    session.commit()
    if outcome == "cancelled":
        revoke(f"{job.id}:{job.attempt}")
    response.status_code = 202 if outcome in ("cancelling", "already_cancelling") else 200
    return _with_metrics(session, job)


@router.post(
    "/{job_id}/retry",
    status_code=202,
    response_model=JobPublic,
    responses=problems(400, 404, 409, 413, 422),
)
def retry_job_route(
    job: JobDep,
    session: SessionDep,
    enqueue: EnqueueDep,
    response: Response,
    body: Deferred[RetryRequest | None] = None,
) -> JobPublic:
    """FAILED / CANCELLED -> QUEUED as attempt n+1, resuming ``from`` the latest complete
    checkpoint (default), ``scratch`` or a checkpoint id."""
    choice = (parse_body(RetryRequest, body, optional=True) or RetryRequest()).from_
    if JobState(job.state) not in (JobState.FAILED, JobState.CANCELLED):
        raise HTTPException(409, "Only FAILED or CANCELLED jobs can be retried.")
    try:
        resume = resolve_resume(session=session, job=job, choice=choice)
    except ValueError as err:
        raise FieldProblem.one("/from", str(err), "not_found") from None
    moved = retry_job(session=session, job=job, resume_from=resume)
    if moved is None:
        raise HTTPException(409, "Only FAILED or CANCELLED jobs can be retried.")
    session.commit()
    job = dispatch(session=session, job=moved, enqueue=enqueue)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_public(job)


@router.delete("/{job_id}", status_code=204, response_class=Response, responses=problems(404, 409))
def delete_job_route(job: JobDep, session: SessionDep, settings: SettingsDep) -> Response:
    """Delete a finished job: its rows and its artifact files."""
    if JobState(job.state) not in TERMINAL_STATES:
        raise HTTPException(409, "Only finished jobs can be deleted; cancel it first.")
    job_id = job.id
    paths = delete_job(session=session, job=job)
    session.commit()
    remove_artifacts(settings, job_id, paths)
    return Response(status_code=204)


@router.get("/{job_id}/attempts", response_model=AttemptsPublic, responses=problems(404))
def list_attempts_route(
    job: JobDep, session: SessionDep, principal: PrincipalDep
) -> AttemptsPublic:
    """Every attempt: start and end, exit reason, the checkpoint it resumed from; the worker
    that ran it (``host:pid``) for admin keys only."""
    items = list_attempts(session=session, tenant_id=job.tenant_id, job_id=job.id)
    admin = principal.allows("admin")
    return AttemptsPublic(items=[attempt_public(a, show_worker=admin) for a in items])
