"""One fail-fast ``Settings`` for the API, the worker and ``comera up`` (env prefix ``COMERA_``).

The embedded defaults need no server: a SQLite store and a SQLite-backed Celery broker
(kombu's SQLAlchemy transport) under ``COMERA_HOME``. Point ``COMERA_DATABASE_URL`` at
PostgreSQL and ``COMERA_BROKER_URL`` at Redis for a distributed deployment.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]

DEFAULT_HOME = Path.home() / ".comera"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COMERA_", extra="ignore", frozen=True)

    home: Path = DEFAULT_HOME
    database_url: str = ""  # default: sqlite:///{home}/comera.db
    broker_url: str = ""  # default: sqla+sqlite:///{home}/broker.db
    artifact_dir: Path | None = None  # default: {home}/artifacts
    data_root: Path | None = None  # default: {home}/data; server-side dataset paths live here
    queue: str = "gpu.any"
    # the API runs sync handlers on a pool of threads; its database pool is as large, so a
    # thread never waits for a connection (each API process: threads <= pool + overflow)
    api_threads: int = Field(default=32, ge=1, le=256)
    db_pool_size: int = Field(default=16, ge=1, le=256)
    db_max_overflow: int = Field(default=16, ge=0, le=256)
    # limits (bad input gets a 4xx, never a worker that runs out of memory)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_upload_bytes: int = Field(default=2 << 30, ge=1024)
    # dataset uploads (service.upload_limits): dropped (408) after this long without data; at
    # most this many at once per tenant and in all (429, per API process); a tenant's stored
    # datasets at most this many bytes (413)
    upload_idle_seconds: float = Field(default=30.0, gt=0, le=3600)
    max_uploads_per_tenant: int = Field(default=4, ge=1, le=1000)
    max_uploads: int = Field(default=32, ge=1, le=10_000)
    max_dataset_bytes_per_tenant: int = Field(default=20 << 30, ge=1024)
    # model uploads (service.model_uploads): one upload at most this many bytes (413), a
    # tenant's stored models at most this many (413); the idle time and slots are the datasets'
    max_model_upload_bytes: int = Field(default=32 << 30, ge=1024)
    max_model_bytes_per_tenant: int = Field(default=100 << 30, ge=1024)
    max_queued_jobs_per_tenant: int = Field(default=100, ge=1)
    # the sum of limits.max_wall_time_s over a tenant's QUEUED jobs (429 past it): 30 days
    max_queued_wall_seconds_per_tenant: int = Field(default=30 * 24 * 3600, ge=10)
    # planning (service.planner): child processes; a request's deadline (waiting included;
    # past it 503 + Retry-After); plans one tenant may have running, and waiting for its turn
    # (past those 429); accept a job whose plan could not be made (the worker's plan then
    # checks it) instead of a 503
    planner_processes: int = Field(default=2, ge=1, le=64)
    plan_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    plans_per_tenant: int = Field(default=1, ge=1, le=64)
    plan_queue_per_tenant: int = Field(default=4, ge=0, le=64)
    accept_unplanned_jobs: bool = False
    # the memory a worker gives one job: a plan estimating more is a 422 (and fails the job in
    # the worker's own plan); the job's process runs under a hard cap of job_memory_cap_bytes
    # (default: this much) above what it had when the job started (worker.memory_cap)
    worker_memory_bytes: int = Field(default=16 << 30, ge=64 << 20)
    job_memory_cap_bytes: int | None = Field(default=None, ge=64 << 20)
    # API keys: per-key requests a minute (0: off) and burst; how long a key stays cached
    rate_limit_per_minute: int = Field(default=1200, ge=0, le=10**7)
    rate_limit_burst: int = Field(default=200, ge=1, le=10**6)
    # where the buckets live (service.ratelimit): ``auto`` shares them through the broker's
    # Redis when the broker is Redis (every API process draws from one bucket per key)
    rate_limit_store: Literal["auto", "local", "redis"] = "auto"
    key_cache_seconds: float = Field(default=30.0, ge=0, le=3600)
    # an unknown key is remembered as unknown this long (no query per request for it)
    key_miss_cache_seconds: float = Field(default=5.0, ge=0, le=3600)
    # failed authentication (no, malformed, unknown or revoked key) per client address and
    # API process: this many a minute on average, bursts of ``auth_failure_burst``; past it
    # 429 with Retry-After, and no key lookup in the store (0: off)
    auth_failures_per_minute: int = Field(default=60, ge=0, le=10**6)
    auth_failure_burst: int = Field(default=30, ge=1, le=10**6)
    # leases (docs/service.md#claim-and-lease)
    lease_seconds: float = Field(default=180.0, gt=0)
    heartbeat_seconds: float = Field(default=30.0, gt=0)
    # a worker refreshes its row (service.store.workers) every heartbeat_seconds; one not seen
    # for this long no longer counts as registered (it stopped, or its machine is gone)
    worker_ttl_seconds: float = Field(default=600.0, gt=0)
    reaper_interval_seconds: float = Field(default=30.0, gt=0)
    # the reaper (service.store.reaper): re-send a job flagged ``enqueue_pending`` after this long
    redrive_after_seconds: float = Field(default=60.0, ge=0)
    # re-send a QUEUED job whose message is gone (a broker restart) after this long
    redeliver_after_seconds: float = Field(default=900.0, ge=0)
    # backoff before a lost attempt runs again: base x 2^(attempt - 1), at most the cap
    retry_backoff_seconds: float = Field(default=60.0, ge=0)
    retry_backoff_max_seconds: float = Field(default=1800.0, ge=0)
    # forced cancellation (docs/service.md#cancellation): SIGTERM after the grace period,
    # SIGKILL this long after
    cancel_grace_seconds: float = Field(default=300.0, ge=0)
    cancel_kill_after_seconds: float = Field(default=60.0, ge=0)
    # a data-parallel job's processes (worker.processes) get this long to stop with a
    # checkpoint after their stop file appears, then SIGTERM (SIGKILL cancel_kill_after later)
    process_stop_grace_seconds: float = Field(default=120.0, ge=0)
    # the queue of the reaper's beat task (``comera.reap``): never a GPU worker's queue
    maintenance_queue: str = "comera.maintenance"
    # the worker's flush of metric / rank points (docs/service.md#progress-and-series)
    flush_seconds: float = Field(default=1.0, gt=0)
    flush_points: int = Field(default=500, ge=1)

    @field_validator("database_url")
    @classmethod
    def _db_scheme(cls, v: str) -> str:
        if v and not v.startswith(("sqlite", "postgresql")):
            raise ValueError(
                f"COMERA_DATABASE_URL must be sqlite:// or postgresql://, got "
                f"{v.split(':', 1)[0]!r}"
            )
        return v

    @field_validator("broker_url")
    @classmethod
    def _broker_scheme(cls, v: str) -> str:
        if v and not v.startswith(("redis://", "rediss://", "sqla+", "filesystem://", "memory://")):
            raise ValueError(
                "COMERA_BROKER_URL must be redis://, sqla+<database url>, "
                "filesystem:// or memory://"
            )
        return v

    @model_validator(mode="after")
    def _pool_covers_threads(self) -> Settings:
        if self.db_pool_size + self.db_max_overflow < self.api_threads:
            raise ValueError(
                "COMERA_DB_POOL_SIZE + COMERA_DB_MAX_OVERFLOW must be at least COMERA_API_THREADS"
            )
        return self

    @model_validator(mode="after")
    def _shared_limit_needs_redis(self) -> Settings:
        if self.rate_limit_store == "redis" and not self.broker.startswith(
            ("redis://", "rediss://")
        ):
            raise ValueError("COMERA_RATE_LIMIT_STORE=redis needs a redis:// COMERA_BROKER_URL")
        return self

    @model_validator(mode="after")
    def _lease_outlives_heartbeat(self) -> Settings:
        if self.lease_seconds <= 2 * self.heartbeat_seconds:
            raise ValueError("COMERA_LEASE_SECONDS must exceed twice COMERA_HEARTBEAT_SECONDS")
        if self.worker_ttl_seconds <= 2 * self.heartbeat_seconds:
            raise ValueError("COMERA_WORKER_TTL_SECONDS must exceed twice COMERA_HEARTBEAT_SECONDS")
        return self

    # -- resolved values ------------------------------------------------------------------
    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'comera.db'}"

    @property
    def broker(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.home / 'broker.db'}"

    @property
    def job_memory_cap(self) -> int:
        """The hard cap on a job's process, above its size at start (``worker.memory_cap``)."""
        return self.job_memory_cap_bytes or self.worker_memory_bytes

    @property
    def artifacts(self) -> Path:
        return self.artifact_dir or self.home / "artifacts"

    @property
    def data(self) -> Path:
        return self.data_root or self.home / "data"

    def ensure_dirs(self) -> None:
        for p in (self.home, self.artifacts, self.data):
            p.mkdir(parents=True, exist_ok=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
