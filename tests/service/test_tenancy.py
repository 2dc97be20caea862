"""Tenancy in the store (docs/service.md#authentication-and-tenancy): the rows of a job carry
its tenant, and every read filters on it, so another tenant finds nothing even given the right
job id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service.store.db.crud.checkpoints import (
    get_checkpoint,
    list_checkpoints,
    newest_export,
    stage_events,
)
from service.store.db.crud.job_queries import latest_metrics, list_attempts
from service.store.db.crud.jobs import create_job, get_job
from service.store.db.crud.series import events_after, metric_series, rank_series
from service.store.db.models import Tenant
from service.store.db.session import make_engine, make_sessionmaker, session_scope
from worker.artifacts import checkpoint_row, find_checkpoint
from worker.recorder import Recorder

TENANTS = ("ten_a", "ten_b")


def _job_with_rows(factory: sessionmaker[Session], tenant: str, artifacts: Path) -> str:
    """A job of ``tenant`` with rows in every table of a job, written by the real writers
    (``create_job``, the worker's recorder and checkpoint rows)."""
    with session_scope(factory) as s:
        s.add(Tenant(id=tenant, name=tenant))
        s.flush()
        job = create_job(
            session=s, tenant_id=tenant, name="j", labels={}, spec={}, spec_hash="h", max_attempts=3
        )
    rec = Recorder(
        factory=factory,
        job_id=job.id,
        tenant_id=tenant,
        attempt=1,
        flush_seconds=60.0,
        flush_points=1000,
    )
    rec.metric("loss", 5, 0.5, stage="early")
    rec.rank(
        "hidden.0",
        5,
        stage="early",
        kind="tt_linear",
        ranks=[1, 2, 1],
        params=10,
        dense=100,
        ratio=10.0,
    )
    rec.event("stage", {"phase": "start", "name": "early", "step": 0})
    weights = artifacts / job.id / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(tenant.encode())
    for kind in ("latest", "export"):
        rec.row(
            checkpoint_row(
                path=weights,
                artifacts=artifacts,
                job_id=job.id,
                tenant_id=tenant,
                attempt=1,
                kind=kind,
                step=5,
                stage="early",
                metrics={},
            )
        )
    rec.flush()
    return job.id


def _reads(
    s: Session, tenant: str, job_id: str, artifacts: Path, checkpoint_ids: list[str]
) -> dict[str, Any]:
    """What each read function finds of ``job_id`` when asked as ``tenant``."""
    of = {"session": s, "tenant_id": tenant, "job_id": job_id}  # the job, asked as ``tenant``
    whole = {"stage": None, "from_step": None, "max_points": 10}  # a whole series
    return {
        "get_job": get_job(session=s, job_id=job_id, tenant_id=tenant),
        "list_attempts": list_attempts(**of),
        "latest_metrics": latest_metrics(session=s, tenant_id=tenant, job_ids=[job_id])[job_id],
        "metric_series": metric_series(**of, **whole, keys=None, to_step=None),
        "rank_series": rank_series(**of, **whole, tensor=None),
        "events_after": events_after(**of, after=0, limit=100),
        "stage_events": stage_events(**of),
        "list_checkpoints": list_checkpoints(**of),
        "get_checkpoint": [
            c for c in checkpoint_ids if get_checkpoint(**of, checkpoint_id=c) is not None
        ],
        "newest_export": newest_export(**of),
        "find_checkpoint": find_checkpoint(s, job_id=job_id, tenant_id=tenant, artifacts=artifacts),
    }


def test_another_tenant_reads_nothing_of_a_job_even_given_its_id(db_url, tmp_path):
    factory = make_sessionmaker(make_engine(db_url))
    jobs = {t: _job_with_rows(factory, t, tmp_path) for t in TENANTS}
    with session_scope(factory) as s:
        for owner, other in (TENANTS, TENANTS[::-1]):
            job_id = jobs[owner]
            ids = [c.id for c in list_checkpoints(session=s, tenant_id=owner, job_id=job_id)]
            assert len(ids) == 2
            mine = _reads(s, owner, job_id, tmp_path, ids)
            empty = [name for name, found in mine.items() if not found]
            assert not empty, f"{owner} does not find its own {empty}"
            assert mine["latest_metrics"] == {"loss": 0.5}
            assert [(p["step"], p["value"]) for p in mine["metric_series"][0].rows] == [(5, 0.5)]
            assert mine["stage_events"] == [{"phase": "start", "name": "early", "step": 0}]
            assert mine["newest_export"].kind == "export" and len(mine["get_checkpoint"]) == 2
            theirs = _reads(s, other, job_id, tmp_path, ids)
            leaked = [name for name, found in theirs.items() if found]
            assert not leaked, f"{other} reads {owner}'s {leaked} through job id {job_id}"
