"""The schema: SQLAlchemy 2.0 typed models. ``migrations/`` creates it; nothing else does.

Every tenant-owned row carries ``tenant_id`` and every query filters on it: the rows of a job
(attempts, events, points, latest metrics, checkpoints) carry their job's tenant, indexed
``(tenant_id, job_id)`` for the tenant-scoped reads and the tenant's cascade. Series tables
have a unique key per (job, key or tensor, step) so a resumed attempt that replays steps
never duplicates a point (the writer upserts: the latest attempt wins).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ApiKey",
    "Base",
    "Checkpoint",
    "Dataset",
    "IdempotencyKey",
    "Job",
    "JobAttempt",
    "JobEvent",
    "LatestMetric",
    "MetricPoint",
    "RankPoint",
    "Tenant",
    "UploadedModel",
    "Worker",
    "utcnow",
]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
Json = JSON().with_variant(JSONB(), "postgresql")
BigId = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only
TZ = DateTime(timezone=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class _JobHistory:
    """The rows a job's attempts write: a serial id, the job (they go with it), the job's
    tenant and the attempt."""

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)


class _SeriesPoint(_JobHistory):
    """A point of a series: the step (and stage) it was measured at, and when."""

    step: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str | None] = mapped_column(String(64))
    t: Mapped[datetime] = mapped_column(TZ, default=utcnow)


def _tenant_job_index(table: str) -> Index:
    """The index of a job's rows for the tenant-scoped reads and the tenant's cascade."""
    return Index(f"ix_{table}_tenant_job", "tenant_id", "job_id")


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex; never the key
    prefix: Mapped[str] = mapped_column(String(16))  # shown to users to tell keys apart
    scopes: Mapped[list[str]] = mapped_column(Json, default=list)
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(TZ)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # job_<ULID>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    labels: Mapped[dict[str, str]] = mapped_column(Json, default=dict)
    state: Mapped[str] = mapped_column(String(16), index=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    spec: Mapped[dict[str, Any]] = mapped_column(Json)
    spec_hash: Mapped[str] = mapped_column(String(64), index=True)
    engine_config: Mapped[dict[str, Any] | None] = mapped_column(Json)
    engine_version: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str | None] = mapped_column(Text)
    error: Mapped[dict[str, Any] | None] = mapped_column(Json)
    progress: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    compression: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    resume_from: Mapped[str | None] = mapped_column(String(64))  # checkpoint id or "scratch"
    enqueue_pending: Mapped[bool] = mapped_column(Boolean, default=False)
    enqueued_at: Mapped[datetime | None] = mapped_column(TZ)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(TZ, index=True)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(TZ)
    cancel_mode: Mapped[str | None] = mapped_column(String(16))
    event_seq: Mapped[int] = mapped_column(Integer, default=0)  # last event sequence number
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(TZ)
    finished_at: Mapped[datetime | None] = mapped_column(TZ)
    updated_at: Mapped[datetime] = mapped_column(TZ, default=utcnow, onupdate=utcnow)
    __table_args__ = (Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"),)


class JobAttempt(_JobHistory, Base):
    __tablename__ = "job_attempts"
    worker: Mapped[str | None] = mapped_column(String(128))
    resume_from: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime | None] = mapped_column(TZ)
    ended_at: Mapped[datetime | None] = mapped_column(TZ)
    exit_reason: Mapped[str | None] = mapped_column(String(32))
    __table_args__ = (
        UniqueConstraint("job_id", "attempt"),
        _tenant_job_index("job_attempts"),
        # a tenant's latest start, for the fair order (service.store.db.crud.fair_queue)
        Index("ix_job_attempts_tenant_started", "tenant_id", "started_at"),
    )


class JobEvent(_JobHistory, Base):
    __tablename__ = "job_events"
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    t: Mapped[datetime] = mapped_column(TZ, default=utcnow)
    __table_args__ = (
        UniqueConstraint("job_id", "seq"),
        _tenant_job_index("job_events"),
    )


class MetricPoint(_SeriesPoint, Base):
    __tablename__ = "metric_points"
    key: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[float | None] = mapped_column(Float)
    value: Mapped[float] = mapped_column(Float)
    __table_args__ = (
        UniqueConstraint("job_id", "key", "step"),
        _tenant_job_index("metric_points"),
    )


class LatestMetric(Base):
    """The newest value of each key, so a status call never scans the series."""

    __tablename__ = "job_latest_metrics"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    t: Mapped[datetime] = mapped_column(TZ, default=utcnow)
    __table_args__ = (_tenant_job_index("job_latest_metrics"),)


class RankPoint(_SeriesPoint, Base):
    __tablename__ = "rank_points"
    tensor: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))
    ranks: Mapped[list[int]] = mapped_column(Json)
    params: Mapped[int] = mapped_column(BigInteger)
    dense: Mapped[int] = mapped_column(BigInteger)
    ratio: Mapped[float] = mapped_column(Float)
    __table_args__ = (
        UniqueConstraint("job_id", "tensor", "step"),
        _tenant_job_index("rank_points"),
    )


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # ckpt_<ULID>
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # latest | final | partial | export
    step: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str | None] = mapped_column(String(64))
    metrics: Mapped[dict[str, float]] = mapped_column(Json, default=dict)
    path: Mapped[str] = mapped_column(String(1024))  # relative to the artifact directory
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    format: Mapped[str] = mapped_column(String(32), default="safetensors")
    state: Mapped[str] = mapped_column(String(16))  # writing | complete | deleted
    manifest: Mapped[dict[str, Any] | None] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)


class Dataset(Base):
    __tablename__ = "datasets"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # ds_<ULID>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    format: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(String(1024))  # relative to the artifact directory
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    rows: Mapped[int | None] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))  # ready | rejected
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)


class UploadedModel(Base):
    """A Hugging Face model directory uploaded by a tenant (``POST /v1/models``), its files
    under ``path``; checked before the row exists (``service.model_uploads``)."""

    __tablename__ = "models"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # mdl_<ULID>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    model_type: Mapped[str] = mapped_column(String(32))  # config.json's
    path: Mapped[str] = mapped_column(String(1024))  # a directory, relative to the artifacts
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # of its files
    sha256: Mapped[str] = mapped_column(String(64))  # of the files' names and sha256s
    files: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)  # name -> bytes, sha256
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))  # sha256 of the canonical body
    state: Mapped[str] = mapped_column(String(16))  # in_flight | done
    status_code: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(Json)
    headers: Mapped[dict[str, str] | None] = mapped_column(Json)
    # the job the submission created, set in the job's own transaction (crud.idempotency)
    job_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(TZ, index=True)


class Worker(Base):
    """A Celery worker and the job queues it consumes, refreshed while it runs
    (``service.store.workers``; not a tenant's row: workers serve every tenant)."""

    __tablename__ = "workers"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # Celery node name
    queues: Mapped[list[str]] = mapped_column(Json, default=list)
    started_at: Mapped[datetime] = mapped_column(TZ, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(TZ, default=utcnow, index=True)
    # what a job's process holds on its host before its model (worker.process_baseline),
    # null until the worker has measured it
    process_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    hf_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    launcher_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
