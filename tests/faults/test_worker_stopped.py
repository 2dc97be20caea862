"""Stopping a running job with signals, as the reaper does (Celery's ``revoke`` with
``terminate``, after ``inspect().active()`` found the task): SIGTERM without a cancel is a
preemption (a checkpoint, then attempt 2 resumes from it); a cancel ends with a partial
checkpoint that can be downloaded."""

from __future__ import annotations

import hashlib

import pytest

from service.core.config import Settings
from service.reaper import CeleryControl
from tests.faults.stack import SPEC, wait_for

pytestmark = pytest.mark.slow
LONG = {**SPEC, "schedule": [{"kind": "early", "steps": 100_000}]}
# long enough that the SIGTERM lands while attempt 1 runs: from step 5 to the signal (two
# inspect() broadcasts, then revoke) took 6-8 s here, about 200 steps of this MLP; 620 steps
# finished first on a faster CI machine
PREEMPTED = {**SPEC, "schedule": [{**stage, "steps": steps} for stage, steps in  # ends: x20
                                  zip(SPEC["schedule"], (4000, 20, 20), strict=True)],
             "training": {**SPEC["training"], "log_every": 20},
             "checkpointing": {"every_n_steps": 500, "keep": 2}}  # fmt: skip
TOTAL = sum(stage["steps"] for stage in PREEMPTED["schedule"])


def _running_at(stack, client, job_id: str, step: int) -> dict:
    def reached() -> dict | None:
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] == "RUNNING" and job["progress"]["step"] >= step else None

    return wait_for(reached, 150, f"job {job_id} to run step {step}", stack.logs)


def test_sigterm_to_the_running_task_preempts_it_and_attempt_2_resumes(stack, redis_server):
    stack.start("reaper", ["reaper"])
    stack.worker("worker")
    client = stack.api()
    job_id = stack.submit(client, PREEMPTED, "preempted")["id"]
    _running_at(stack, client, job_id, 5)
    [attempt] = client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    control = CeleryControl(Settings(broker_url=redis_server.url))
    task, owner = f"{job_id}:1", attempt["worker"]
    assert control.running(task, owner) is True  # inspect().active() on the worker
    assert control.running(f"{job_id}:2", owner) is False
    assert control.terminate(task, owner, "SIGTERM")  # revoke(terminate=True)

    job = stack.wait_state(client, job_id, timeout=300)
    assert job["state"] == "SUCCEEDED", (job["error"], stack.logs())
    attempts = client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    assert [(a["attempt"], a["exit_reason"]) for a in attempts] == [
        (1, "preempted"), (2, "completed")]  # fmt: skip
    items = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    [partial] = [c for c in items if c["kind"] == "partial"]
    assert partial["attempt"] == 1 and attempts[1]["resume_from"] == partial["id"]
    series = client.get(f"/v1/jobs/{job_id}/metrics", params={"keys": "loss"}).json()["series"]
    assert [p["step"] for p in series[0]["points"]] == list(range(20, TOTAL + 1, 20))


def test_a_cancelled_running_job_leaves_a_downloadable_partial_checkpoint(stack):
    stack.start("reaper", ["reaper"])
    stack.worker("worker")
    client = stack.api()
    job_id = stack.submit(client, LONG, "cancelled")["id"]
    _running_at(stack, client, job_id, 12)
    r = client.post(f"/v1/jobs/{job_id}/cancel", json={"mode": "immediate"})
    assert r.status_code == 202, r.text

    job = stack.wait_state(client, job_id, timeout=60)
    assert job["state"] == "CANCELLED", stack.logs()
    [attempt] = client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    assert attempt["exit_reason"] == "cancelled"
    items = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    [partial] = [c for c in items if c["kind"] == "partial"]
    assert partial["state"] == "complete" and partial["step"] >= 12
    assert partial["id"] in job["message"]
    content = client.get(f"/v1/jobs/{job_id}/checkpoints/{partial['id']}/content")
    assert content.status_code == 200 and len(content.content) == partial["size_bytes"]
    assert hashlib.sha256(content.content).hexdigest() == partial["sha256"]
