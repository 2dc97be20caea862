"""Control of a running job, on both stores: cancellation mid-run, and resume after a failure."""

from __future__ import annotations

import time

import pytest
import torch
from safetensors import safe_open
from sqlalchemy import update

from api_schemas import JobState
from service.store.db.crud.jobs import transition
from service.store.db.models import Job, JobAttempt, utcnow
from service.store.db.session import session_scope
from tests.worker import jobs
from worker.artifacts import sha256_file
from worker.pipeline import run_job

S = JobState
LONG = [{"kind": "early", "steps": 200_000}]  # would take minutes: it must be stopped


def _cancel_when(factory, job_id: str, step: int, *, via_state: bool, deadline: float) -> None:
    """What the API does, from another thread once the job has reached ``step``."""
    while time.monotonic() < deadline:
        job, _ = jobs.get(factory, job_id)
        if job.state == "RUNNING" and job.progress.get("step", 0) >= step:
            if via_state:
                jobs.move(factory, job_id, S.RUNNING, S.CANCELLING, cancel_requested_at=utcnow())
            else:
                with session_scope(factory) as s:
                    s.execute(
                        update(Job).where(Job.id == job_id).values(cancel_requested_at=utcnow())
                    )
            return
        time.sleep(0.02)


@pytest.mark.parametrize("via_state", [False, True], ids=["flag", "cancelling"])
def test_a_cancelled_job_stops_with_a_partial_checkpoint(db_url, tmp_path, via_state):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(schedule=LONG))
    deadline = time.monotonic() + 60
    outcome, _ = jobs.run_beside(
        lambda: _cancel_when(factory, job_id, 20, via_state=via_state, deadline=deadline),
        job_id=job_id,
        settings=settings,
        factory=factory,
    )
    assert outcome == "cancelled"  # not the end of its 200,000 steps (the partial's step below)

    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "CANCELLED" and attempt.exit_reason == "cancelled" and attempt.ended_at
    assert job.lease_owner is None and job.finished_at is not None
    [partial] = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "partial"]
    assert partial.state == "complete" and 20 <= partial.step < 200_000
    assert partial.step == job.progress["step"] and partial.id in job.message
    assert sha256_file(settings.artifacts / partial.path) == partial.sha256
    evs = jobs.events(factory, job_id)
    states = [e.data["state"] for e in evs if e.kind == "state"]
    assert states == ["QUEUED", "STARTING", "RUNNING", "CANCELLING", "CANCELLED"]
    assert any(e.kind == "heartbeat" for e in evs)  # the lease was kept while it ran


def test_a_worker_that_lost_its_lease_stops_and_leaves_the_job_alone(db_url, tmp_path):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(schedule=LONG))
    requeued = {}

    def reaper() -> None:  # the lease "expired": the job goes back to the queue, attempt 2
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job, _ = jobs.get(factory, job_id)
            if job.state == "RUNNING" and job.progress.get("step", 0) >= 20:
                with session_scope(factory) as s:
                    back = transition(
                        session=s,
                        job_id=job_id,
                        from_states=[S.RUNNING],
                        to_state=S.QUEUED,
                        attempt=1,
                        lease_owner=None,
                    )
                    s.execute(update(Job).where(Job.id == job_id).values(attempt=2))
                    requeued["version"] = back.version
                return
            time.sleep(0.02)

    outcome, _ = jobs.run_beside(reaper, job_id=job_id, settings=settings, factory=factory)
    assert outcome == "lost"
    job, [attempt] = jobs.get(factory, job_id)
    assert (job.state, job.attempt, job.version) == ("QUEUED", 2, requeued["version"])
    assert attempt.exit_reason == "worker_lost" and attempt.ended_at is not None


def test_a_job_at_its_wall_time_limit_checkpoints_then_fails_as_timeout(db_url, tmp_path):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(schedule=LONG))
    deadline = time.monotonic() + 1.0  # what the task derives from Celery's soft limit
    out = run_job(job_id=job_id, attempt=1, settings=settings, factory=factory, deadline=deadline)
    assert out == "failed" and time.monotonic() - deadline < 10
    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == "timeout"
    assert job.error["type"] == "https://comera.dev/problems/timeout"
    assert job.error["retryable"] is False and "wall-time limit" in job.error["detail"]
    [partial] = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "partial"]
    assert partial.step == job.error["step"] == job.progress["step"]


class Crash:
    """An engine callback that fails the attempt at a given step (a worker-side error)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def __getattr__(self, name: str):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return self._event

    def _event(self, event: dict) -> None:
        if event["event"] == "progress" and event["step"] == self.step:
            raise OSError(f"disk went away at step {self.step}")


def _retry(factory, job_id: str, attempt: int, resume_from: str = "latest_checkpoint") -> None:
    """What ``POST /v1/jobs/{id}/retry`` does: FAILED -> QUEUED with the next attempt."""
    assert jobs.move(factory, job_id, S.FAILED, S.QUEUED, resume_from=resume_from)
    with session_scope(factory) as s:
        s.execute(update(Job).where(Job.id == job_id).values(attempt=attempt))
        s.add(JobAttempt(job_id=job_id, tenant_id=s.get(Job, job_id).tenant_id, attempt=attempt))


@pytest.mark.parametrize(("resume_from", "step"), [("latest_checkpoint", 20), ("step-10", 10)])
def test_a_failed_attempt_resumes_from_its_checkpoint_exactly(db_url, tmp_path, resume_from, step):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    reference = jobs.make_job(factory, jobs.tiny_spec())
    assert run_job(job_id=reference, attempt=1, settings=settings, factory=factory) == "succeeded"

    job_id = jobs.make_job(factory, jobs.tiny_spec())
    out = run_job(
        job_id=job_id, attempt=1, settings=settings, factory=factory, callbacks=[Crash(step=27)]
    )
    assert out == "failed"
    job, [first] = jobs.get(factory, job_id)
    assert first.exit_reason == "error" and job.error["retryable"] is True
    assert job.error["step"] == 27 and "disk went away" in job.error["detail"]
    assert 25 in jobs.metric_series(factory, job_id)["loss"]  # recorded before the failure

    if resume_from == "step-10":  # a checkpoint named by id
        [resume_from] = [c.id for c in jobs.checkpoints(factory, job_id) if c.step == 10]
    _retry(factory, job_id, 2, resume_from)
    assert run_job(job_id=job_id, attempt=2, settings=settings, factory=factory) == "succeeded"

    job, [_, second] = jobs.get(factory, job_id)
    resumed = {c.id: c for c in jobs.checkpoints(factory, job_id)}[second.resume_from]
    assert (resumed.attempt, resumed.kind, resumed.step) == (1, "latest", step)
    # the steps from the checkpoint to 27 ran twice; every point exists once and equals the
    # uninterrupted run
    got, want = jobs.metric_series(factory, job_id), jobs.metric_series(factory, reference)
    got.pop("seconds_per_step"), want.pop("seconds_per_step")
    assert got == want
    assert jobs.rank_series(factory, job_id) == jobs.rank_series(factory, reference)
    ref_job, _ = jobs.get(factory, reference)
    assert job.compression["report_checkpoint_id"] != ref_job.compression["report_checkpoint_id"]
    same = {k: v for k, v in job.compression.items() if k != "report_checkpoint_id"}
    assert same == {k: v for k, v in ref_job.compression.items() if k != "report_checkpoint_id"}
    [export] = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "export"]
    [ref_export] = [c for c in jobs.checkpoints(factory, reference) if c.kind == "export"]
    with (
        safe_open(str(settings.artifacts / export.path), "pt") as got_f,
        safe_open(str(settings.artifacts / ref_export.path), "pt") as want_f,
    ):
        # the same weights, bit for bit (not the same file bytes: safetensors writes its
        # header metadata in hash-map order)
        assert sorted(got_f.keys()) == sorted(want_f.keys())
        for key in want_f.keys():  # noqa: SIM118
            assert torch.equal(got_f.get_tensor(key), want_f.get_tensor(key)), key
