"""tenant_id on the rows of a job (attempts, events, points, latest metrics)

Every row carries its tenant (docs/service.md#authentication-and-tenancy): the five tables reached
through a job get ``tenant_id`` (NOT NULL, FK to tenants, ON DELETE CASCADE) and an index
``(tenant_id, job_id)``. Existing rows take their job's tenant. A row whose job is gone cannot be
reached by anyone (it only exists when foreign keys were not enforced), so it is deleted rather than
left without a tenant. On SQLite the NOT NULL and the FK rebuild the table (batch mode).

Create Date: 2026-11-30 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"

TABLES = ("job_attempts", "job_events", "metric_points", "rank_points", "job_latest_metrics")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column("tenant_id", sa.String(length=40), nullable=True))
        op.execute(
            f"UPDATE {table} SET tenant_id = "
            f"(SELECT jobs.tenant_id FROM jobs WHERE jobs.id = {table}.job_id)"
        )
        op.execute(f"DELETE FROM {table} WHERE tenant_id IS NULL")
        with op.batch_alter_table(table) as batch_op:
            batch_op.alter_column("tenant_id", existing_type=sa.String(length=40), nullable=False)
            batch_op.create_foreign_key(
                f"fk_{table}_tenant_id_tenants",
                "tenants",
                ["tenant_id"],
                ["id"],
                ondelete="CASCADE",
            )
            batch_op.create_index(f"ix_{table}_tenant_job", ["tenant_id", "job_id"], unique=False)


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_index(f"ix_{table}_tenant_job")
            batch_op.drop_constraint(f"fk_{table}_tenant_id_tenants", type_="foreignkey")
            batch_op.drop_column("tenant_id")
