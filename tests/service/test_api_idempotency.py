"""``Idempotency-Key`` on ``POST /v1/jobs``: replay, key reuse, in flight, expiry, failures."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from api_schemas import JobCreate
from service.store.db.models import IdempotencyKey, Job, utcnow
from service.store.spec import spec_hash
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


def _abandon(api: Api, key: str, *, minutes: float, job_id: str | None) -> None:
    """The key as a request whose API process died ``minutes`` ago leaves it: in flight,
    with or without the job it had stored."""
    with api.sessions() as s, s.begin():
        row = s.get(IdempotencyKey, (api.tenant_id(), key))
        if row is None:
            fingerprint = spec_hash(JobCreate.model_validate(job_body()))
            row = IdempotencyKey(
                tenant_id=api.tenant_id(),
                key=key,
                fingerprint=fingerprint,
                expires_at=utcnow() + timedelta(hours=23),
            )
            s.add(row)
        row.state, row.status_code, row.response, row.headers = "in_flight", None, None, None
        row.job_id, row.created_at = job_id, utcnow() - timedelta(minutes=minutes)


def test_the_job_id_is_written_with_the_job(api: Api):
    first = api.client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": "k-1"})
    with api.sessions() as s:
        assert s.get(IdempotencyKey, (api.tenant_id(), "k-1")).job_id == first.json()["id"]


def test_a_key_abandoned_after_its_job_was_stored_replays_that_job(api: Api):
    headers = {"Idempotency-Key": "died-late"}
    first = api.client.post("/v1/jobs", json=job_body(), headers=headers).json()
    _abandon(api, "died-late", minutes=1, job_id=first["id"])  # recent: maybe still running
    assert api.client.post("/v1/jobs", json=job_body(), headers=headers).status_code == 409
    _abandon(api, "died-late", minutes=10, job_id=first["id"])  # stale: the process is gone
    again = api.client.post("/v1/jobs", json=job_body(), headers=headers)
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first["id"] and _jobs(api) == 1 and len(api.enqueued) == 1
    replay = api.client.post("/v1/jobs", json=job_body(), headers=headers)  # now answered
    assert replay.json()["id"] == first["id"] and replay.headers["idempotent-replayed"] == "true"


def test_a_key_abandoned_before_any_job_was_stored_is_taken_over(api: Api):
    headers = {"Idempotency-Key": "died-early"}
    _abandon(api, "died-early", minutes=1, job_id=None)
    assert api.client.post("/v1/jobs", json=job_body(), headers=headers).status_code == 409
    _abandon(api, "died-early", minutes=10, job_id=None)
    taken = api.client.post("/v1/jobs", json=job_body(), headers=headers)
    assert taken.status_code == 202 and "idempotent-replayed" not in taken.headers
    assert _jobs(api) == 1
    other = api.client.post("/v1/jobs", json=job_body(name="x"), headers=headers)
    assert other.status_code == 422  # the key still belongs to its first body
