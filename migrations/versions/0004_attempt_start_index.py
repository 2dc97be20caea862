"""job_attempts (tenant_id, started_at): a tenant's latest start, for the fair order

The worker orders the tenants waiting in a queue by the jobs they have running, then by when
their latest attempt started (``service.store.db.crud.fair_queue``); this index answers the
second without reading a tenant's whole history of attempts.

Create Date: 2026-12-05 11:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_index("ix_job_attempts_tenant_started", "job_attempts", ["tenant_id", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_job_attempts_tenant_started", table_name="job_attempts")
