"""Helpers of the HTTP API tests: an app on a real migrated database, and job setup.

The fixtures ``api`` (once per backend, SQLite and PostgreSQL) and ``api_lite`` (SQLite only,
for tests where the backend does not matter) are defined in ``tests/conftest.py`` and serve the
app through ``serve_api``. The queue is replaced by a recorder (the real broker path is covered
by the worker's and the end-to-end tests); the planner is the real spawned child.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import insert, update
from sqlalchemy.orm import Session, sessionmaker

from api_schemas import JobCreate
from service.api.deps import get_enqueue, get_revoke
from service.main import create_app
from service.store.auth import ALL_SCOPES
from service.store.db.crud.api_keys import create_key
from service.store.db.crud.jobs import create_job
from service.store.db.crud.tenants import get_or_create_tenant
from service.store.db.models import Checkpoint, Job, utcnow
from service.store.settings import Settings
from service.store.spec import spec_hash
from tests.helpers.specs import api_job, early_stage, late_stage, mlp_model, synthetic_dataset

__all__ = [
    "BLOB",
    "NO_KEY",
    "Api",
    "add_checkpoint",
    "issue_key",
    "job_body",
    "make_job",
    "parse_sse",
    "serve_api",
    "set_state",
    "write_artifact",
]

BLOB = os.urandom(5000) + b"end"  # a checkpoint file's content (the download tests)
NO_KEY = "X-Test-No-Idempotency-Key"  # a request header: submit without an Idempotency-Key


@dataclass
class Api:
    client: TestClient
    settings: Settings
    sessions: sessionmaker[Session]
    enqueued: list[dict[str, Any]] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    send_ok: bool = True
    key: str = ""  # an API key of tenant "default" with every scope (the client sends it)

    def tenant_id(self) -> str:
        with self.sessions() as s:
            return get_or_create_tenant(session=s, name="default").id


def serve_api(db_url: str, tmp_path: Path, **overrides: Any) -> Iterator[Api]:
    """The app on ``db_url`` with a recording queue and a key of tenant ``default``
    (``overrides``: more settings)."""
    settings = Settings(
        home=tmp_path / "home",
        database_url=db_url,
        broker_url="memory://",
        max_body_bytes=16 * 1024,
        max_upload_bytes=64 * 1024,
        **overrides,
    )
    app = create_app(settings)
    box: dict[str, Api] = {}

    def enqueue(**kw: Any) -> bool:
        box["api"].enqueued.append(kw)
        return box["api"].send_ok

    app.dependency_overrides[get_enqueue] = lambda: enqueue
    app.dependency_overrides[get_revoke] = lambda: box["api"].revoked.append
    with TestClient(app) as client:
        key = issue_key(app)
        client.headers["Authorization"] = f"Bearer {key}"
        client.event_hooks["request"].append(_idempotency_key)
        box["api"] = Api(client, settings, app.state.sessionmaker, key=key)
        yield box["api"]


def issue_key(app: Any, tenant: str = "default", scopes: Any = ALL_SCOPES) -> str:
    """A new API key in the started ``app``'s store (plaintext)."""
    with app.state.sessionmaker() as s:
        return create_key(session=s, tenant=tenant, scopes=scopes)[1]


def _idempotency_key(request: httpx.Request) -> None:
    """A fresh ``Idempotency-Key`` on a submission that names none (the header is required;
    the idempotency tests set theirs, and ``NO_KEY`` leaves it out)."""
    if request.method == "POST" and request.url.path.rstrip("/") == "/v1/jobs":
        if request.headers.pop(NO_KEY, None) is None and "Idempotency-Key" not in request.headers:
            request.headers["Idempotency-Key"] = uuid.uuid4().hex


def job_body(**changes: Any) -> dict[str, Any]:
    """A small valid submission (a tiny MLP on synthetic data)."""
    body = {
        "name": "tiny-mlp",
        "model": mlp_model(64, 64),
        "dataset": synthetic_dataset(n_train=256, n_valid=32),
        "compression": {"max_rank": 4, "min_size": 256},
        "schedule": [early_stage(steps=5), late_stage(steps=5, target_ratio=0.5)],
    }
    return api_job(**{**body, **changes})


def make_job(
    api: Api,
    *,
    name: str = "job",
    labels: dict[str, str] | None = None,
    state: str = "QUEUED",
    created_at: datetime | None = None,
    body: dict[str, Any] | None = None,
    **values: Any,
) -> str:
    """Insert a job straight into the store (setup for read-side tests); returns its id."""
    spec = JobCreate.model_validate(body or job_body(name=name, labels=labels or {}))
    tenant = api.tenant_id()
    with api.sessions() as s, s.begin():
        job = create_job(
            session=s,
            tenant_id=tenant,
            name=name,
            labels=labels or {},
            spec=spec.model_dump(mode="json"),
            spec_hash=spec_hash(spec),
            max_attempts=3,
        )
        job_id = job.id
    set_state(api, job_id, state, **({"created_at": created_at} if created_at else {}), **values)
    return job_id


def set_state(api: Api, job_id: str, state: str, **values: Any) -> None:
    """Put a job in ``state`` directly (what a worker would have done)."""
    with api.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(state=state, **values))


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events of an SSE body: ``{"id", "event", "data"}`` (comments dropped)."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            fields[key] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            out.append(fields)
    return out


def add_checkpoint(
    api: Api,
    job_id: str,
    ckpt_id: str,
    rel: str,
    *,
    kind: str = "latest",
    state: str = "complete",
    sha: str | None = None,
    manifest: dict | None = None,
    step: int = 42,
    stage: str | None = "late",
    metrics: dict[str, float] | None = None,
    size_bytes: int = len(BLOB),
    created_at: datetime | None = None,
) -> None:
    """A checkpoint row of ``job_id`` (attempt 1; by default step 42 of the late stage) for
    the file ``rel`` of ``BLOB``'s size under the artifacts directory."""
    with api.sessions() as s, s.begin():
        s.execute(
            insert(Checkpoint),
            [
                {
                    "id": ckpt_id,
                    "job_id": job_id,
                    "tenant_id": api.tenant_id(),
                    "attempt": 1,
                    "kind": kind,
                    "step": step,
                    "stage": stage,
                    "metrics": {"loss": 0.5} if metrics is None else metrics,
                    "path": rel,
                    "size_bytes": size_bytes,
                    "sha256": sha,
                    "state": state,
                    "manifest": manifest,
                    "created_at": created_at or utcnow(),
                }
            ],
        )


def write_artifact(api: Api, rel: str, data: bytes = BLOB) -> Path:
    """``data`` written at ``rel`` under the artifacts directory."""
    path = Path(api.settings.artifacts) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
