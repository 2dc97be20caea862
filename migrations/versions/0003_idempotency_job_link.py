"""idempotency_keys.job_id: the job a submission created, written with the job

A submission's Idempotency-Key row stays ``in_flight`` until the API stores the answer. If
the API process dies in between, the row alone cannot tell whether the job was created; the
job id, set in the transaction that inserts the job, can (``service.store.db.crud.idempotency``).

Create Date: 2026-11-30 06:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch_op:
        batch_op.add_column(sa.Column("job_id", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch_op:
        batch_op.drop_column("job_id")
