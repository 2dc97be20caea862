"""API keys: 401 without a valid key, scopes (403), tenant isolation (404), rate limit (429),
keys stored only as sha256 and never logged, the required Idempotency-Key, and the
``keys`` commands (first key of ``comera up`` in a 0600 file)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from service.keys_cli import ensure_first_key
from service.main import create_app
from service.ratelimit import RateLimiter
from service.store.auth import hash_key, looks_like_key
from service.store.db.models import ApiKey, Checkpoint, utcnow
from service.store.settings import Settings
from tests.helpers.services import run_python
from tests.service.api_helpers import NO_KEY, Api, issue_key, job_body, make_job


def _as(api: Api, key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _client(api: Api, key: str | None) -> TestClient:
    """A second client of the same app, with another key (or none)."""
    client = TestClient(api.client.app)
    client.headers.update(_as(api, key))
    return client


def test_missing_malformed_unknown_and_revoked_keys_are_401(api: Api):
    anon = _client(api, None)
    r = anon.get("/v1/jobs")
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    assert r.headers["www-authenticate"].startswith("Bearer")
    for bad in ("nonsense", "cmr_" + "x" * 200, "cmr_deadbeef_notakey"):
        r = _client(api, bad).get("/v1/jobs")
        assert r.status_code == 401, bad
        assert bad not in r.text
    assert _client(api, None).get("/v1/healthz").status_code == 200  # probes stay open
    # revoked: refused once the cache entry is gone (COMERA_KEY_CACHE_SECONDS)
    key = issue_key(api.client.app, tenant="default", scopes=["jobs:read"])
    assert _client(api, key).get("/v1/jobs").status_code == 200
    with api.sessions() as s, s.begin():
        s.execute(
            update(ApiKey).where(ApiKey.key_hash == hash_key(key)).values(revoked_at=utcnow())
        )
    assert _client(api, key).get("/v1/jobs").status_code == 200  # still cached
    api.client.app.state.key_cache.clear()
    assert _client(api, key).get("/v1/jobs").status_code == 401


def test_keys_are_stored_as_sha256_only(api: Api):
    key = issue_key(api.client.app, tenant="acme")
    assert looks_like_key(key)
    with api.sessions() as s:
        rows = s.scalars(select(ApiKey)).all()
    stored = {r.key_hash for r in rows}
    assert hashlib.sha256(key.encode()).hexdigest() in stored
    dump = repr([(r.id, r.prefix, r.key_hash, r.scopes) for r in rows])
    secret = key.split("_", 2)[2]  # the secret is URL-safe base64: it may hold "_" itself
    assert key not in dump and secret not in dump


def test_scopes_by_method_and_for_artifacts(api: Api):
    job_id = make_job(api, state="RUNNING")
    reader = _client(api, issue_key(api.client.app, scopes=["jobs:read"]))
    assert reader.get(f"/v1/jobs/{job_id}").status_code == 200
    r = reader.post("/v1/jobs", json=job_body())
    assert r.status_code == 403 and "jobs:write" in r.json()["detail"]
    assert reader.post(f"/v1/jobs/{job_id}/cancel", json={}).status_code == 403
    assert reader.get(f"/v1/jobs/{job_id}/checkpoints").status_code == 403  # artifacts:read
    artifacts = _client(api, issue_key(api.client.app, scopes=["jobs:read", "artifacts:read"]))
    assert artifacts.get(f"/v1/jobs/{job_id}/checkpoints").status_code == 200
    writer = _client(api, issue_key(api.client.app, scopes=["jobs:write"]))
    assert writer.get(f"/v1/jobs/{job_id}").status_code == 403
    admin = _client(api, issue_key(api.client.app, scopes=["admin"]))
    assert admin.get(f"/v1/jobs/{job_id}/checkpoints").status_code == 200


def test_another_tenants_job_checkpoint_and_dataset_are_404(api: Api):
    job_id = make_job(api, state="RUNNING")
    with api.sessions() as s, s.begin():
        s.add(
            Checkpoint(
                id="ckpt_x",
                job_id=job_id,
                tenant_id=api.tenant_id(),
                attempt=1,
                kind="latest",
                step=1,
                stage="early",
                metrics={},
                path="x",
                size_bytes=1,
                state="complete",
            )
        )
    up = api.client.post(
        "/v1/datasets?name=d&format=text",
        content=b"one\ntwo\n",
        headers={"content-type": "application/octet-stream"},
    )
    assert up.status_code == 201, up.text
    ds = up.json()["id"]
    other = _client(api, issue_key(api.client.app, tenant="other"))
    for path in (
        f"/v1/jobs/{job_id}",
        f"/v1/jobs/{job_id}/metrics",
        f"/v1/jobs/{job_id}/events",
        f"/v1/jobs/{job_id}/checkpoints",
        f"/v1/jobs/{job_id}/checkpoints/ckpt_x/content",
        f"/v1/datasets/{ds}",
    ):
        assert other.get(path).status_code == 404, path
    assert other.post(f"/v1/jobs/{job_id}/cancel", json={}).status_code == 404
    assert other.delete(f"/v1/datasets/{ds}").status_code == 404
    assert other.get("/v1/jobs").json()["items"] == []
    assert other.get("/v1/datasets").json()["items"] == []
    # and the owner still sees both
    assert api.client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert api.client.get(f"/v1/datasets/{ds}").status_code == 200


def test_rate_limit_per_key_is_429_with_retry_after(api_lite: Api):
    app = api_lite.client.app
    app.state.rate_limiter = RateLimiter(per_minute=1, burst=3)  # no refill within the test
    slow = _client(api_lite, issue_key(app))
    codes = [slow.get("/v1/jobs").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = slow.get("/v1/jobs")
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.headers["content-type"] == "application/problem+json"
    assert _client(api_lite, issue_key(app)).get("/v1/jobs").status_code == 200  # per key


def test_failed_authentication_is_limited_per_address(api_lite: Api):
    app = api_lite.client.app
    assert api_lite.client.get("/v1/jobs").status_code == 200  # a known key, now cached
    app.state.auth_failures = RateLimiter(per_minute=1, burst=3)  # no refill within the test
    unknown = _client(api_lite, "cmr_0000abcd_" + "Q" * 43)
    codes = [unknown.get("/v1/jobs").status_code for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    r = _client(api_lite, None).get("/v1/jobs")  # no key at all counts as a failure too
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.headers["content-type"] == "application/problem+json"
    assert "failed authentications" in r.json()["detail"]
    assert api_lite.client.get("/v1/jobs").status_code == 200  # known keys are served


def test_an_unknown_key_costs_one_lookup_per_miss_ttl(api_lite: Api, monkeypatch):
    from service.api import deps

    lookups: list[str] = []
    real = deps._lookup

    def counted(request, key_hash):
        lookups.append(key_hash)
        return real(request, key_hash)

    monkeypatch.setattr(deps, "_lookup", counted)
    cache = api_lite.client.app.state.key_cache
    assert cache.miss_ttl == api_lite.settings.key_miss_cache_seconds == 5.0
    unknown = _client(api_lite, "cmr_0000abcd_" + "R" * 43)
    assert [unknown.get("/v1/jobs").status_code for _ in range(5)] == [401] * 5
    assert len(lookups) == 1  # the misses after the first come from the cache
    api_lite.client.app.state.key_cache.clear()
    assert unknown.get("/v1/jobs").status_code == 401 and len(lookups) == 2


def test_bucket_refills_at_the_stated_rate():
    limiter = RateLimiter(per_minute=120, burst=2)  # 2 tokens a second
    assert [limiter.take("k", now=0.0) for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("k", now=0.0) == pytest.approx(0.5)
    assert limiter.take("k", now=0.25) == pytest.approx(0.25)  # half a token by then
    assert limiter.take("k", now=0.5) == 0.0
    assert RateLimiter.retry_after(0.01) == "1" and RateLimiter.retry_after(2.2) == "3"


def test_keys_never_appear_in_logs(api: Api, caplog: pytest.LogCaptureFixture):
    key = issue_key(api.client.app, tenant="logs")
    bad = "cmr_0000abcd_" + "Z" * 43
    with caplog.at_level(logging.DEBUG):
        client = _client(api, key)
        client.get("/v1/jobs")
        client.post("/v1/jobs", json=job_body())
        client.get("/v1/jobs/job_missing")
        _client(api, bad).get("/v1/jobs")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records and key not in text and bad not in text


def test_idempotency_key_is_required_on_submit(api_lite: Api):
    r = api_lite.client.post("/v1/jobs", json=job_body(), headers={NO_KEY: "1"})
    assert r.status_code == 422
    assert r.json()["errors"][0]["parameter"].lower() == "idempotency-key"
    assert api_lite.client.get("/v1/jobs").json()["items"] == []


def test_first_key_of_embedded_mode_is_printed_once_and_kept_0600(tmp_path: Path):
    from service.store.db.migrate import upgrade

    settings = Settings(home=tmp_path, broker_url="memory://")
    settings.ensure_dirs()
    upgrade(settings.db_url)
    key = ensure_first_key(settings)
    assert key and looks_like_key(key)
    path = tmp_path / "api_key"
    assert path.read_text().strip() == key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ensure_first_key(settings) is None  # a store with a key gets no second one
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        assert client.get("/v1/jobs").status_code == 200


def test_keys_commands_create_list_and_revoke(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env["COMERA_HOME"] = str(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_python("-m", "service.cli", *args, env=env)

    assert cli("migrate").returncode == 0
    made = cli("keys", "create", "--tenant", "acme", "--scope", "jobs:read")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert looks_like_key(key) and key not in made.stderr
    listing = cli("keys", "list")
    assert "acme" in listing.stdout and "jobs:read" in listing.stdout
    assert key not in listing.stdout and key.split("_")[1] in listing.stdout  # prefix only
    key_id = listing.stdout.split()[0]
    bad = cli("keys", "create", "--tenant", "acme", "--scope", "root")
    assert bad.returncode != 0 and "unknown scope" in bad.stderr
    assert cli("keys", "revoke", key_id).returncode == 0
    assert cli("keys", "revoke", key_id).returncode == 1
    assert key_id not in cli("keys", "list").stdout
