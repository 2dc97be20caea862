"""workers: the Celery workers and the job queues they consume

A worker writes its row when it starts and refreshes ``seen_at`` while it runs
(``worker.registration``); the API refuses a job whose placement no recently seen worker
serves, and marks a job ``waiting_for_capacity`` when no worker has reported at all
(``service.store.workers``).

Create Date: 2026-12-05 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column(
            "queues", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )
    op.create_index(op.f("ix_workers_seen_at"), "workers", ["seen_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_workers_seen_at"), table_name="workers")
    op.drop_table("workers")
