"""The app as a whole: health, readiness, Prometheus, OpenAPI, body limit, start-up checks,
and the lean import (the API process never imports torch)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.main import SchemaNotReady, create_app
from service.store.settings import Settings
from tests.service.api_helpers import Api, issue_key, make_job

ROOT = Path(__file__).resolve().parents[2]


def test_healthz_and_readyz(api: Api):
    assert api.client.get("/v1/healthz").json() == {"status": "ok", "checks": {}}
    ready = api.client.get("/v1/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_is_503_when_the_broker_port_is_closed(sqlite_url: str, tmp_path: Path):
    settings = Settings(home=tmp_path, database_url=sqlite_url, broker_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings)) as client:
        resp = client.get("/v1/readyz")
    assert resp.status_code == 503 and resp.headers["retry-after"] == "5"
    body = resp.json()
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert body["checks"]["database"] == "ok" and body["checks"]["broker"] != "ok"
    assert "broker" in body["detail"]


def test_readyz_checks_a_sql_broker_for_real(sqlite_url: str, tmp_path: Path):
    down = "sqla+postgresql://postgres@127.0.0.1:1/nowhere"
    settings = Settings(home=tmp_path, database_url=sqlite_url, broker_url=down)
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/readyz").status_code == 503
    up = Settings(
        home=tmp_path,
        database_url=sqlite_url,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
    )
    with TestClient(create_app(up)) as client:
        assert client.get("/v1/readyz").status_code == 200


def test_prometheus_metrics_by_route_template_and_jobs_by_state(api: Api):
    running = make_job(api, state="RUNNING")
    make_job(api, state="RUNNING")
    make_job(api, state="FAILED")
    api.client.get(f"/v1/jobs/{running}")
    api.client.get("/v1/jobs/job_nope")
    api.client.get("/not/a/route")
    text_ = api.client.get("/metrics").text
    assert 'comera_jobs{state="RUNNING"} 2.0' in text_
    assert 'comera_jobs{state="FAILED"} 1.0' in text_
    assert 'comera_jobs{state="QUEUED"} 0.0' in text_
    assert (
        'comera_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"} 1.0'
    ) in text_
    assert 'route="/v1/jobs/{job_id}",status="404"} 1.0' in text_
    assert 'route="<unmatched>",status="404"} 1.0' in text_
    assert "comera_http_request_duration_seconds_bucket" in text_
    assert "comera_oldest_queued_job_age_seconds 0.0" in text_


def test_openapi_describes_every_route_with_problems(api_lite: Api):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. duplicate operation ids
        doc = api_lite.client.get("/openapi.json").json()
    paths = doc["paths"]
    for path, verbs in {
        "/v1/jobs": {"get", "post"},
        "/v1/jobs:validate": {"post"},
        "/v1/jobs/{job_id}": {"get", "patch", "delete"},
        "/v1/jobs/{job_id}/cancel": {"post"},
        "/v1/jobs/{job_id}/retry": {"post"},
        "/v1/jobs/{job_id}/attempts": {"get"},
        "/v1/jobs/{job_id}/events": {"get"},
        "/v1/jobs/{job_id}/metrics": {"get"},
        "/v1/jobs/{job_id}/ranks": {"get"},
        "/v1/jobs/{job_id}/report": {"get"},
        "/v1/jobs/{job_id}/checkpoints": {"get"},
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/content": {"get", "head"},
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/manifest": {"get"},
        "/v1/datasets": {"get", "post"},
        "/v1/datasets/{dataset_id}": {"get", "delete"},
        "/v1/healthz": {"get"},
        "/v1/readyz": {"get"},
        "/metrics": {"get"},
    }.items():
        assert verbs <= set(paths[path]), path
    submit = paths["/v1/jobs"]["post"]
    assert submit["tags"] == ["jobs"] and "202" in submit["responses"]
    problem = submit["responses"]["422"]["content"]["application/problem+json"]["schema"]
    assert problem == {"$ref": "#/components/schemas/Problem"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert "application/octet-stream" in paths["/v1/datasets"]["post"]["requestBody"]["content"]
    assert (
        "text/event-stream"
        in paths["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    )
    assert {
        "JobCreate",
        "JobPublic",
        "ValidationReport",
        "CompressionReport",
        "MetricsPublic",
        "RanksPublic",
        "EventsPublic",
        "DatasetPublic",
    } <= set(doc["components"]["schemas"])


def test_body_limit_declared_and_streamed(api_lite: Api):
    limit = api_lite.settings.max_body_bytes
    big = b'{"name": "' + b"x" * limit + b'"}'
    declared = api_lite.client.post(
        "/v1/jobs", content=big, headers={"content-type": "application/json"}
    )
    assert declared.status_code == 413
    assert declared.headers["content-type"].startswith("application/problem+json")

    def chunks():
        yield b'{"name": "'
        for _ in range(limit // 1024 + 1):
            yield b"y" * 1024
        yield b'"}'

    streamed = api_lite.client.post(
        "/v1/jobs:validate", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413 and streamed.json()["status"] == 413


def test_start_up_fails_fast_unless_the_schema_is_at_head(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with create_engine(url).begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    app = create_app(Settings(home=tmp_path, database_url=url, broker_url="memory://"))
    with pytest.raises(SchemaNotReady, match="run the migrations"), TestClient(app):
        pass


def test_importing_the_api_does_not_import_torch():
    code = (
        "import sys; import service.main as m; m.create_app(); "
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in "
        "('torch', 'engine', 'triton', 'worker')); print(bad); assert not bad"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "COMERA_HOME": "/tmp/comera-lean"},
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_database_down_is_503_with_retry_after(pg_url: str, tmp_path: Path):
    from tests.helpers.db import PG_SERVER

    app = create_app(Settings(home=tmp_path, database_url=pg_url, broker_url="memory://"))
    admin = create_engine(
        "postgresql+psycopg://" + PG_SERVER.removeprefix("postgresql://"),
        isolation_level="AUTOCOMMIT",
    )
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {issue_key(app)}"
        assert client.get("/v1/jobs").status_code == 200
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{pg_url.rsplit("/", 1)[1]}" WITH (FORCE)'))
        resp = client.get("/v1/jobs")
        assert resp.status_code == 503 and resp.headers["retry-after"] == "5"
        assert resp.json()["detail"] == "The database is unavailable; nothing was stored."
        assert client.get("/v1/readyz").json()["checks"]["database"] != "ok"
    admin.dispose()
