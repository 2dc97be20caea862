"""Cancel, retry and delete follow the state rules of docs/service.md#job-states and
#cancellation."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, insert, select

from service.store.db.models import Checkpoint, Job, JobAttempt, JobEvent, MetricPoint, utcnow
from tests.service.api_helpers import Api, add_checkpoint, make_job


def _checkpoint(
    api: Api,
    job_id: str,
    ckpt_id: str,
    *,
    state: str = "complete",
    kind: str = "latest",
    step: int = 10,
    rel: str | None = None,
) -> Path:
    rel = rel or f"jobs/{job_id}/{ckpt_id}.safetensors"
    path = Path(api.settings.artifacts) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    add_checkpoint(
        api,
        job_id,
        ckpt_id,
        rel,
        kind=kind,
        state=state,
        sha="0" * 64,
        step=step,
        stage=None,
        metrics={},
        size_bytes=7,
    )
    return path


def test_cancel_queued_is_immediate_and_revokes(api: Api):
    job_id = make_job(api)
    resp = api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert resp.status_code == 200 and resp.json()["state"] == "CANCELLED"
    assert resp.json()["cancel_requested_at"] is not None
    assert api.revoked == [f"{job_id}:1"]
    again = api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 200 and again.json()["version"] == resp.json()["version"]


@pytest.mark.parametrize("state", ["STARTING", "RUNNING"])
def test_cancel_running_asks_the_worker(api: Api, state: str):
    job_id = make_job(api, state=state)
    resp = api.client.post(f"/v1/jobs/{job_id}/cancel", json={"mode": "immediate"})
    assert resp.status_code == 202 and resp.json()["state"] == "CANCELLING"
    with api.sessions() as s:
        job = s.get(Job, job_id)
        assert job.cancel_mode == "immediate" and job.cancel_requested_at is not None
        last = s.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq.desc())
        ).first()
        assert last.data == {
            "state": "CANCELLING",
            "attempt": 1,
            "reason": "cancel requested",
            "mode": "immediate",
            "save_partial": True,
        }
    assert api.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202  # already
    assert api.revoked == []


@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED"])
def test_cancel_finished_is_409(api_lite: Api, state: str):
    job_id = make_job(api_lite, state=state)
    resp = api_lite.client.post(f"/v1/jobs/{job_id}/cancel")
    assert resp.status_code == 409 and resp.json()["detail"] == "The job has already finished."
    bad = api_lite.client.post(f"/v1/jobs/{job_id}/cancel", json={"mode": "now"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/mode"


def test_retry_creates_attempt_n_plus_1_from_the_latest_checkpoint(api: Api):
    job_id = make_job(
        api, state="FAILED", finished_at=utcnow(), error={"title": "oom", "status": 500}
    )
    _checkpoint(api, job_id, "ckpt_old", step=5)
    _checkpoint(api, job_id, "ckpt_new", step=9)
    _checkpoint(api, job_id, "ckpt_writing", step=12, state="writing")
    resp = api.client.post(f"/v1/jobs/{job_id}/retry")
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["state"] == "QUEUED" and job["attempt"] == 2 and job["error"] is None
    assert job["finished_at"] is None
    assert api.enqueued[-1] == {
        "job_id": job_id,
        "attempt": 2,
        "max_wall_time_s": 21600,
        "devices": 1,
        "nodes": 1,
    }
    with api.sessions() as s:
        assert s.get(Job, job_id).resume_from == "ckpt_new"
        attempts = s.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.attempt)
        ).all()
        assert [(a.attempt, a.resume_from) for a in attempts] == [(1, None), (2, "ckpt_new")]
    listed = api.client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    assert [a["attempt"] for a in listed] == [1, 2]
    assert api.client.post(f"/v1/jobs/{job_id}/retry").status_code == 409  # QUEUED now


def test_retry_from_scratch_or_a_named_checkpoint(api_lite: Api):
    job_id = make_job(api_lite, state="CANCELLED")
    _checkpoint(api_lite, job_id, "ckpt_a")
    bad = api_lite.client.post(f"/v1/jobs/{job_id}/retry", json={"from": "ckpt_zzz"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/from"
    ok = api_lite.client.post(f"/v1/jobs/{job_id}/retry", json={"from": "ckpt_a"})
    assert ok.status_code == 202 and ok.json()["attempt"] == 2
    other = make_job(api_lite, state="FAILED")
    scratch = api_lite.client.post(f"/v1/jobs/{other}/retry", json={"from": "scratch"})
    assert scratch.status_code == 202
    with api_lite.sessions() as s:
        assert s.get(Job, job_id).resume_from == "ckpt_a"
        assert s.get(Job, other).resume_from == "scratch"


@pytest.mark.parametrize("state", ["QUEUED", "RUNNING", "CANCELLING", "SUCCEEDED"])
def test_retry_only_from_failed_or_cancelled(api_lite: Api, state: str):
    job_id = make_job(api_lite, state=state)
    assert api_lite.client.post(f"/v1/jobs/{job_id}/retry").status_code == 409


def test_delete_removes_rows_and_artifacts_of_finished_jobs_only(api: Api):
    running = make_job(api, state="RUNNING")
    assert api.client.delete(f"/v1/jobs/{running}").status_code == 409
    job_id = make_job(api, state="SUCCEEDED")
    path = _checkpoint(api, job_id, "ckpt_x")
    with api.sessions() as s, s.begin():
        s.execute(
            insert(MetricPoint),
            [
                {
                    "job_id": job_id,
                    "tenant_id": api.tenant_id(),
                    "attempt": 1,
                    "key": "loss",
                    "step": 1,
                    "value": 1.0,
                    "t": utcnow(),
                }
            ],
        )
    assert api.client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert not path.exists() and not path.parent.exists()
    assert api.client.get(f"/v1/jobs/{job_id}").status_code == 404
    with api.sessions() as s:
        for table in (Checkpoint, MetricPoint, JobEvent, JobAttempt):
            count = s.scalar(select(func.count()).select_from(table).where(table.job_id == job_id))
            assert count == 0, table
    assert api.client.get(f"/v1/jobs/{running}").status_code == 200
