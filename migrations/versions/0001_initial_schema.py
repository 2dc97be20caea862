"""initial schema

Create Date: 2026-11-29 20:08:32.850716
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None


def _json(name: str, *, nullable: bool) -> sa.Column:
    """A JSON column, stored as JSONB on PostgreSQL."""
    kind = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    return sa.Column(name, kind, nullable=nullable)


def _time(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _text(name: str, length: int, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.String(length=length), nullable=nullable)


def _serial_id() -> sa.Column:
    """The BIGINT (INTEGER on SQLite, so that it autoincrements) primary key of a series table."""
    kind = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    return sa.Column("id", kind, autoincrement=True, nullable=False)


def _cascade(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    """``table.column`` references ``target.id``; deleting the target deletes the row."""
    name = op.f(f"fk_{table}_{column}_{target}")
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=name, ondelete="CASCADE")


def _tenant_table(name: str, *columns: sa.Column, unique: str | None = None) -> None:
    """A table of rows a tenant owns: a string ``id`` key and ``tenant_id`` (the rows go with
    their tenant) before ``columns``; ``unique``: a column no two rows share."""
    constraints = [
        _cascade(name, "tenant_id", "tenants"),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
    ]
    if unique:  # made last: a table's DDL lists its constraints in the order they were made
        constraints.append(sa.UniqueConstraint(unique, name=op.f(f"uq_{name}_{unique}")))
    op.create_table(name, _text("id", 40), _text("tenant_id", 40), *columns, *constraints)


def _series_table(name: str, *columns: sa.Column, unique: tuple[str, ...]) -> None:
    """A table of a job's series: a serial ``id`` key and ``job_id`` (the rows go with their
    job) before ``columns``; no two rows share the columns of ``unique`` (``job_id`` first)."""
    op.create_table(
        name,
        _serial_id(),
        _text("job_id", 40),
        *columns,
        _cascade(name, "job_id", "jobs"),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
        sa.UniqueConstraint(*unique, name=op.f(f"uq_{name}_job_id")),
    )


def upgrade() -> None:
    op.create_table(
        "tenants",
        _text("id", 40),
        _text("name", 128),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    _tenant_table(
        "api_keys",
        _text("key_hash", 64),
        _text("prefix", 16),
        _json("scopes", nullable=False),
        _time("created_at"),
        _time("revoked_at", nullable=True),
        unique="key_hash",
    )
    _tenant_table(
        "datasets",
        _text("name", 128),
        _text("format", 16),
        _text("path", 1024),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        _text("sha256", 64),
        sa.Column("rows", sa.BigInteger(), nullable=True),
        _text("state", 16),
        sa.Column("error", sa.Text(), nullable=True),
        _time("created_at"),
    )
    op.create_table(
        "idempotency_keys",
        _text("tenant_id", 40),
        _text("key", 255),
        _text("fingerprint", 64),
        _text("state", 16),
        sa.Column("status_code", sa.Integer(), nullable=True),
        _json("response", nullable=True),
        _json("headers", nullable=True),
        _time("created_at"),
        _time("expires_at"),
        _cascade("idempotency_keys", "tenant_id", "tenants"),
        sa.PrimaryKeyConstraint("tenant_id", "key", name=op.f("pk_idempotency_keys")),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_idempotency_keys_expires_at"), ["expires_at"], unique=False
        )

    _tenant_table(
        "jobs",
        _text("name", 128),
        _json("labels", nullable=False),
        _text("state", 16),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        _json("spec", nullable=False),
        _text("spec_hash", 64),
        _json("engine_config", nullable=True),
        _text("engine_version", 32, nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        _json("error", nullable=True),
        _json("progress", nullable=False),
        _json("compression", nullable=False),
        _text("resume_from", 64, nullable=True),
        sa.Column("enqueue_pending", sa.Boolean(), nullable=False),
        _time("enqueued_at", nullable=True),
        _text("lease_owner", 128, nullable=True),
        _time("lease_expires_at", nullable=True),
        _time("cancel_requested_at", nullable=True),
        _text("cancel_mode", 16, nullable=True),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        _time("created_at"),
        _time("started_at", nullable=True),
        _time("finished_at", nullable=True),
        _time("updated_at"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_created_at"), ["created_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_jobs_lease_expires_at"), ["lease_expires_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_jobs_spec_hash"), ["spec_hash"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)
        batch_op.create_index(
            "ix_jobs_tenant_created", ["tenant_id", "created_at", "id"], unique=False
        )

    op.create_table(
        "checkpoints",
        _text("id", 40),
        _text("job_id", 40),
        _text("tenant_id", 40),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _text("kind", 16),
        sa.Column("step", sa.Integer(), nullable=False),
        _text("stage", 64, nullable=True),
        _json("metrics", nullable=False),
        _text("path", 1024),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        _text("sha256", 64, nullable=True),
        _text("format", 32),
        _text("state", 16),
        _json("manifest", nullable=True),
        _time("created_at"),
        _cascade("checkpoints", "job_id", "jobs"),
        _cascade("checkpoints", "tenant_id", "tenants"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_checkpoints_job_id"), ["job_id"], unique=False)

    _series_table(
        "job_attempts",
        sa.Column("attempt", sa.Integer(), nullable=False),
        _text("worker", 128, nullable=True),
        _text("resume_from", 64, nullable=True),
        _time("started_at", nullable=True),
        _time("ended_at", nullable=True),
        _text("exit_reason", 32, nullable=True),
        unique=("job_id", "attempt"),
    )
    _series_table(
        "job_events",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _text("kind", 16),
        _json("data", nullable=False),
        _time("t"),
        unique=("job_id", "seq"),
    )
    op.create_table(
        "job_latest_metrics",
        _text("job_id", 40),
        _text("key", 64),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        _time("t"),
        _cascade("job_latest_metrics", "job_id", "jobs"),
        sa.PrimaryKeyConstraint("job_id", "key", name=op.f("pk_job_latest_metrics")),
    )
    _series_table(
        "metric_points",
        sa.Column("attempt", sa.Integer(), nullable=False),
        _text("key", 64),
        sa.Column("step", sa.Integer(), nullable=False),
        _text("stage", 64, nullable=True),
        sa.Column("epoch", sa.Float(), nullable=True),
        sa.Column("value", sa.Float(), nullable=False),
        _time("t"),
        unique=("job_id", "key", "step"),
    )
    _series_table(
        "rank_points",
        sa.Column("attempt", sa.Integer(), nullable=False),
        _text("tensor", 256),
        sa.Column("step", sa.Integer(), nullable=False),
        _text("stage", 64, nullable=True),
        _text("kind", 32),
        _json("ranks", nullable=False),
        sa.Column("params", sa.BigInteger(), nullable=False),
        sa.Column("dense", sa.BigInteger(), nullable=False),
        sa.Column("ratio", sa.Float(), nullable=False),
        _time("t"),
        unique=("job_id", "tensor", "step"),
    )


def downgrade() -> None:

    op.drop_table("rank_points")
    op.drop_table("metric_points")
    op.drop_table("job_latest_metrics")
    op.drop_table("job_events")
    op.drop_table("job_attempts")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_job_id"))

    op.drop_table("checkpoints")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_tenant_created")
        batch_op.drop_index(batch_op.f("ix_jobs_state"))
        batch_op.drop_index(batch_op.f("ix_jobs_spec_hash"))
        batch_op.drop_index(batch_op.f("ix_jobs_lease_expires_at"))
        batch_op.drop_index(batch_op.f("ix_jobs_created_at"))

    op.drop_table("jobs")
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_keys_expires_at"))

    op.drop_table("idempotency_keys")
    op.drop_table("datasets")
    op.drop_table("api_keys")
    op.drop_table("tenants")
