"""workers: the memory baseline each worker measured for a job's process on its host

A worker measures what a job's process holds before its model and data when it starts
(``worker.process_baseline``) and writes it with its heartbeat (``worker.registration``); the
API's planner counts the largest of the workers that count (``service.store.workers``).

Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"

COLUMNS = ("process_bytes", "hf_bytes", "launcher_bytes")


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
