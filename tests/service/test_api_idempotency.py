"""``Idempotency-Key`` on ``POST /v1/jobs``: replay, key reuse, in flight, expiry, failures."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from api_schemas import JobCreate
from service.db.models import IdempotencyKey, Job, utcnow
from service.spec import spec_hash
from tests.service.api_helpers import Api, job_body


def _jobs(api: Api) -> int:
    with api.sessions() as s:
        return s.scalar(select(func.count()).select_from(Job))


def test_same_key_and_body_replays_the_first_answer(api: Api):
    headers = {"Idempotency-Key": "k-1"}
    first = api.client.post("/v1/jobs", json=job_body(), headers=headers)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    again = api.client.post("/v1/jobs", json=job_body(), headers=headers)
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json() and again.headers["location"] == first.headers["location"]
    assert _jobs(api) == 1 and len(api.enqueued) == 1  # stored and sent once
    other = api.client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k-2"})
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    assert _jobs(api) == 2


def test_key_reused_with_another_body_is_422_and_in_flight_is_409(api: Api):
    headers = {"Idempotency-Key": "k-1"}
    assert api.client.post("/v1/jobs", json=job_body(), headers=headers).status_code == 202
    changed = api.client.post("/v1/jobs", json=job_body(name="other"), headers=headers)
    assert changed.status_code == 422 and "different body" in changed.json()["detail"]
    fingerprint = spec_hash(JobCreate.model_validate(job_body()))
    with api.sessions() as s, s.begin():  # a first request that is still running
        s.add(
            IdempotencyKey(
                tenant_id=api.tenant_id(),
                key="busy",
                fingerprint=fingerprint,
                state="in_flight",
                expires_at=utcnow() + timedelta(hours=1),
            )
        )
    busy = api.client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "busy"})
    assert busy.status_code == 409
    assert _jobs(api) == 1


def test_expired_keys_are_reused_and_failed_requests_forget_their_key(api: Api):
    headers = {"Idempotency-Key": "k-1"}
    first = api.client.post("/v1/jobs", json=job_body(), headers=headers).json()
    with api.sessions() as s, s.begin():
        s.get(IdempotencyKey, (api.tenant_id(), "k-1")).expires_at = utcnow() - timedelta(1)
    fresh = api.client.post("/v1/jobs", json=job_body(), headers=headers)
    assert fresh.status_code == 202 and fresh.json()["id"] != first["id"]
    # a request refused after the key was taken (an engine refusal) leaves no key behind
    bad = job_body(compression={"layers": ["nothing*"]})
    assert (
        api.client.post("/v1/jobs", json=bad, headers={"Idempotency-Key": "k-3"}).status_code == 422
    )
    with api.sessions() as s:
        assert s.get(IdempotencyKey, (api.tenant_id(), "k-3")) is None
    long_key = {"Idempotency-Key": "x" * 256}
    assert api.client.post("/v1/jobs", json=job_body(), headers=long_key).status_code == 422
