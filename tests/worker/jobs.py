"""Helpers of the worker tests: settings, tiny job specs, job rows and what a job wrote."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobCreate, JobState
from service.store.db.crud.jobs import create_job, transition
from service.store.db.models import (
    Checkpoint,
    Job,
    JobAttempt,
    JobEvent,
    LatestMetric,
    MetricPoint,
    RankPoint,
    Tenant,
)
from service.store.db.session import make_engine, make_sessionmaker, session_scope
from service.store.settings import Settings
from service.store.spec import spec_hash
from tests.helpers.specs import mlp_run
from worker.pipeline import run_job

__all__ = [
    "JOB_ROW_MODELS",
    "TENANT",
    "checkpoints",
    "events",
    "factory_for",
    "get",
    "make_job",
    "metric_series",
    "move",
    "row_tenants",
    "run_beside",
    "settings_for",
    "tiny_spec",
]

JOB_ROW_MODELS = (JobAttempt, JobEvent, MetricPoint, RankPoint, LatestMetric, Checkpoint)

TENANT = "ten_worker"

TINY: dict[str, Any] = mlp_run()


def tiny_spec(**sections: Any) -> dict[str, Any]:
    """The tiny 35-step MLP job (a few seconds on a CPU), with sections replaced."""
    return mlp_run(**copy.deepcopy(sections))


def settings_for(home: Path, db_url: str, **over: Any) -> Settings:
    values: dict[str, Any] = {
        "home": home,
        "database_url": db_url,
        "flush_seconds": 0.05,
        "heartbeat_seconds": 0.2,
        "lease_seconds": 5.0,
    }
    return Settings(**{**values, **over})


def factory_for(db_url: str) -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(db_url))


def make_job(factory: sessionmaker[Session], spec: dict[str, Any], *, tenant: str = TENANT) -> str:
    """A QUEUED job (attempt 1) of ``tenant`` (the test tenant), as the API creates it."""
    body = JobCreate.model_validate(spec)
    with session_scope(factory) as s:
        if s.get(Tenant, tenant) is None:
            s.add(Tenant(id=tenant, name=tenant))
            s.flush()
        job = create_job(
            session=s,
            tenant_id=tenant,
            name=body.name,
            labels={},
            spec=body.model_dump(mode="json"),
            spec_hash=spec_hash(body),
            max_attempts=3,
        )
        return job.id


def move(
    factory: sessionmaker[Session],
    job_id: str,
    source: JobState,
    target: JobState,
    **values: Any,
) -> bool:
    """``transition`` of ``job_id`` from ``source`` to ``target`` (with ``values``: attempt,
    columns to set) in a session of its own, as another part of the service makes it;
    whether the job was in ``source``."""
    with session_scope(factory) as s:
        job = transition(session=s, job_id=job_id, from_states=[source], to_state=target, **values)
        return job is not None


def run_beside(
    side: Callable[[], object],
    *,
    job_id: str,
    settings: Settings,
    factory: sessionmaker[Session],
) -> tuple[str, float]:
    """``run_job`` of attempt 1 while ``side`` runs in a thread of its own (what the API, the
    reaper or a signal does meanwhile): its outcome and the seconds it took."""
    thread = threading.Thread(target=side)
    thread.start()
    t0 = time.monotonic()
    try:
        outcome = run_job(job_id=job_id, attempt=1, settings=settings, factory=factory)
    finally:
        thread.join()
    return outcome, time.monotonic() - t0


def get(factory: sessionmaker[Session], job_id: str) -> tuple[Job, list[JobAttempt]]:
    with session_scope(factory) as s:
        job = s.get(Job, job_id)
        attempts = s.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.attempt)
        ).all()
        return job, list(attempts)


def metric_series(factory: sessionmaker[Session], job_id: str) -> dict[str, dict[int, float]]:
    """``{key: {step: value}}``; asserts that no (key, step) appears twice."""
    with session_scope(factory) as s:
        rows = s.scalars(select(MetricPoint).where(MetricPoint.job_id == job_id)).all()
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        assert r.step not in out.setdefault(r.key, {}), f"duplicate point {r.key}@{r.step}"
        out[r.key][r.step] = r.value
    return out


def rank_series(factory: sessionmaker[Session], job_id: str) -> dict[tuple[str, int], list[int]]:
    with session_scope(factory) as s:
        rows = s.scalars(select(RankPoint).where(RankPoint.job_id == job_id)).all()
    out: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        assert (r.tensor, r.step) not in out, f"duplicate rank point {r.tensor}@{r.step}"
        out[(r.tensor, r.step)] = list(r.ranks)
    return out


def row_tenants(factory: sessionmaker[Session], job_id: str) -> dict[str, list[str]]:
    """``{table: [tenant_id of each row of the job]}`` for every table of a job's rows."""
    with session_scope(factory) as s:
        return {
            m.__tablename__: list(s.scalars(select(m.tenant_id).where(m.job_id == job_id)))
            for m in JOB_ROW_MODELS
        }


def checkpoints(factory: sessionmaker[Session], job_id: str) -> list[Checkpoint]:
    with session_scope(factory) as s:
        return list(
            s.scalars(
                select(Checkpoint)
                .where(Checkpoint.job_id == job_id)
                .order_by(Checkpoint.created_at)
            ).all()
        )


def events(factory: sessionmaker[Session], job_id: str) -> list[JobEvent]:
    with session_scope(factory) as s:
        return list(
            s.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)
            ).all()
        )
