"""The store: migrations on both backends, and compare-and-set transitions."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, select

from api_schemas import JobState
from service.store.db.crud.jobs import create_job, transition
from service.store.db.migrate import current_revision, head_revision
from service.store.db.models import Base, JobEvent, Tenant
from service.store.db.session import make_engine, make_sessionmaker, session_scope

S = JobState
JOB_TABLES = ("job_attempts", "job_events", "metric_points", "rank_points", "job_latest_metrics")


def _tenant(factory) -> str:
    with session_scope(factory) as s:
        s.add(Tenant(id="ten_1", name="t1"))
    return "ten_1"


def test_migrations_create_exactly_the_models_schema(db_url):
    engine = make_engine(db_url)
    assert current_revision(engine) == head_revision() != ""
    tables = set(inspect(engine).get_table_names()) - {"alembic_version"}
    assert tables == set(Base.metadata.tables)
    for name, table in Base.metadata.tables.items():
        cols = {c["name"] for c in inspect(engine).get_columns(name)}
        assert cols == {c.name for c in table.columns}, name


def test_transitions_are_compare_and_set_and_log_events(db_url):
    factory = make_sessionmaker(make_engine(db_url))
    tenant = _tenant(factory)
    with session_scope(factory) as s:
        job = create_job(
            session=s, tenant_id=tenant, name="j", labels={}, spec={}, spec_hash="h", max_attempts=3
        )
    with session_scope(factory) as s:
        won = transition(
            session=s,
            job_id=job.id,
            from_states=[S.QUEUED],
            to_state=S.STARTING,
            attempt=1,
            lease_owner="w1",
        )
        assert won is not None and won.state == "STARTING" and won.version == 2
    with session_scope(factory) as s:  # a duplicate message loses the race
        assert (
            transition(
                session=s, job_id=job.id, from_states=[S.QUEUED], to_state=S.STARTING, attempt=1
            )
            is None
        )
        assert (
            transition(
                session=s, job_id=job.id, from_states=[S.STARTING], to_state=S.RUNNING, version=1
            )
            is None
        )  # stale version
        done = transition(session=s, job_id=job.id, from_states=[S.STARTING], to_state=S.FAILED)
        assert done.finished_at is not None and done.lease_owner is None
    with session_scope(factory) as s:  # terminal: only a retry (to QUEUED) leaves it
        with pytest.raises(ValueError):
            transition(session=s, job_id=job.id, from_states=[S.FAILED], to_state=S.RUNNING)
        events = s.scalars(
            select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.seq)
        ).all()
        assert [e.seq for e in events] == [1, 2, 3]
        assert [e.data["state"] for e in events] == ["QUEUED", "STARTING", "FAILED"]


def test_upgrade_downgrade_upgrade_and_models_agree_with_migrations(db_url):
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from service.store.db.migrate import alembic_config

    cfg = alembic_config(db_url)
    engine = make_engine(db_url)
    command.downgrade(cfg, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    command.upgrade(cfg, "head")
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], diff
    engine.dispose()


def test_the_tenant_migration_gives_existing_rows_their_jobs_tenant(db_url):
    """Rows written at revision 0001 (no ``tenant_id`` on a job's rows) take their job's
    tenant in 0002, and the column is then NOT NULL."""
    import sqlalchemy as sa
    from alembic import command

    from service.store.db.migrate import alembic_config
    from service.store.db.models import utcnow

    cfg, engine, now = alembic_config(db_url), make_engine(db_url), utcnow()
    command.downgrade(cfg, "0001")
    names = ("tenants", "jobs", *JOB_TABLES)
    with engine.begin() as conn:
        t = {n: sa.Table(n, sa.MetaData(), autoload_with=conn) for n in names}
        assert all("tenant_id" not in t[n].c for n in JOB_TABLES)
        jobs = {"job_a": "ten_a", "job_b": "ten_b", "job_c": "ten_a"}
        conn.execute(
            t["tenants"].insert(),
            [{"id": x, "name": x, "created_at": now} for x in set(jobs.values())],
        )
        conn.execute(
            t["jobs"].insert(),
            [
                {
                    "id": j,
                    "tenant_id": ten,
                    "name": j,
                    "labels": {},
                    "state": "RUNNING",
                    "version": 1,
                    "attempt": 1,
                    "max_attempts": 3,
                    "spec": {},
                    "spec_hash": "h",
                    "progress": {},
                    "compression": {},
                    "enqueue_pending": False,
                    "event_seq": 2,
                    "created_at": now,
                    "updated_at": now,
                }
                for j, ten in jobs.items()
            ],
        )
        for j in jobs:
            conn.execute(t["job_attempts"].insert(), [{"job_id": j, "attempt": a} for a in (1, 2)])
            conn.execute(
                t["job_events"].insert(),
                [
                    {"job_id": j, "seq": q, "attempt": 1, "kind": "log", "data": {}, "t": now}
                    for q in (1, 2)
                ],
            )
            conn.execute(
                t["metric_points"].insert(),
                [
                    {"job_id": j, "attempt": 1, "key": "loss", "step": st, "value": 1.0, "t": now}
                    for st in (1, 2)
                ],
            )
            conn.execute(
                t["rank_points"].insert(),
                [
                    {
                        "job_id": j,
                        "attempt": 1,
                        "tensor": "h",
                        "step": st,
                        "kind": "tt",
                        "ranks": [1],
                        "params": 1,
                        "dense": 2,
                        "ratio": 2.0,
                        "t": now,
                    }
                    for st in (1, 2)
                ],
            )
            conn.execute(
                t["job_latest_metrics"].insert(),
                [{"job_id": j, "key": k, "step": 2, "value": 1.0, "t": now} for k in ("a", "b")],
            )
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        for name in JOB_TABLES:
            got = sorted(conn.execute(sa.text(f"SELECT job_id, tenant_id FROM {name}")).all())
            assert got == sorted((j, ten) for j, ten in jobs.items() for _ in (1, 2)), name
            column = next(c for c in inspect(conn).get_columns(name) if c["name"] == "tenant_id")
            assert column["nullable"] is False, name
    engine.dispose()
