"""The store: migrations on both backends, and compare-and-set transitions."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, select

from api_schemas import JobState
from service.db.crud.jobs import create_job, transition
from service.db.migrate import current_revision, head_revision
from service.db.models import Base, JobEvent, Tenant
from service.db.session import make_engine, make_sessionmaker, session_scope

S = JobState


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
        job = create_job(session=s, tenant_id=tenant, name="j", labels={}, spec={}, spec_hash="h",
                         max_attempts=3)  # fmt: skip
    with session_scope(factory) as s:
        won = transition(session=s, job_id=job.id, from_states=[S.QUEUED], to_state=S.STARTING,
                         attempt=1, lease_owner="w1")  # fmt: skip
        assert won is not None and won.state == "STARTING" and won.version == 2
    with session_scope(factory) as s:  # a duplicate message loses the race
        assert transition(session=s, job_id=job.id, from_states=[S.QUEUED],
                          to_state=S.STARTING, attempt=1) is None  # fmt: skip
        assert transition(session=s, job_id=job.id, from_states=[S.STARTING],
                          to_state=S.RUNNING, version=1) is None  # stale version  # fmt: skip
        done = transition(session=s, job_id=job.id, from_states=[S.STARTING], to_state=S.FAILED)
        assert done.finished_at is not None and done.lease_owner is None
    with session_scope(factory) as s:  # terminal: only a retry (to QUEUED) leaves it
        with pytest.raises(ValueError):
            transition(session=s, job_id=job.id, from_states=[S.FAILED], to_state=S.RUNNING)
        events = s.scalars(select(JobEvent).where(JobEvent.job_id == job.id)
                           .order_by(JobEvent.seq)).all()  # fmt: skip
        assert [e.seq for e in events] == [1, 2, 3]
        assert [e.data["state"] for e in events] == ["QUEUED", "STARTING", "FAILED"]


def test_upgrade_downgrade_upgrade_and_models_agree_with_migrations(db_url):
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from service.db.migrate import alembic_config

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
