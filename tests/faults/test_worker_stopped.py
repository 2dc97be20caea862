"""Stopping a running job with signals, as the reaper does (Celery's ``revoke`` with
``terminate``, after ``inspect().active()`` found the task): SIGTERM without a cancel is a
preemption (a checkpoint, then attempt 2 resumes from it); a cancel ends with a partial
checkpoint that can be downloaded."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess

import pytest
from sqlalchemy import select

from service.store.db.models import JobAttempt
from service.store.db.session import make_engine
from service.store.settings import Settings
from service.task_control import CeleryControl
from tests.faults.stack import SPEC, wait_for
from tests.helpers.groups import SERVICES

pytestmark = [pytest.mark.slow, SERVICES]
LONG = {**SPEC, "schedule": [{"kind": "early", "steps": 100_000}]}
# attempt 1 is frozen (SIGSTOP) from the step it is seen at until the signal has been sent, so
# however long the broadcasts take (two inspect() calls of 2 s, then revoke) it cannot finish
# first; the first stage only needs to outlast the poll that sees step 5 (~1 s, ~80 steps).
# Evaluations and shrink checks are sparse: attempt 2 spends them again after the preemption
PREEMPTED = {
    **SPEC,
    "compression": {**SPEC["compression"], "shrink_every": 100},
    "schedule": [
        {**stage, "steps": steps, **({"eval_every": 1000} if "eval_every" in stage else {})}
        for stage, steps in zip(SPEC["schedule"], (600, 20, 20), strict=True)  # ends: x20
    ],
    "training": {**SPEC["training"], "log_every": 20},
    "checkpointing": {"every_n_steps": 500, "keep": 2},
}
TOTAL = sum(stage["steps"] for stage in PREEMPTED["schedule"])


def _running_at(stack, client, job_id: str, step: int) -> dict:
    def reached() -> dict | None:
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] == "RUNNING" and job["progress"]["step"] >= step else None

    return wait_for(reached, 150, f"job {job_id} to run step {step}", stack.logs)


def _pending_sigterm(pid: int) -> bool:
    """Whether a SIGTERM waits for the (stopped) process ``pid`` (``SigPnd``/``ShdPnd``)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    bit = 1 << (signal.SIGTERM - 1)
    return any(int(fields[k], 16) & bit for k in ("SigPnd", "ShdPnd"))


def _worker_of(stack, job_id: str, attempt: int) -> str:
    """The ``host:pid`` that runs ``attempt`` (from the store: the API shows it to admins only)."""
    engine = make_engine(stack.db_url)
    try:
        with engine.connect() as conn:
            return conn.scalar(
                select(JobAttempt.worker).where(
                    JobAttempt.job_id == job_id, JobAttempt.attempt == attempt
                )
            )
    finally:
        engine.dispose()


# the API, a reaper, a worker and two attempts of a 640-step job: 21-28 s alone, 29-34 s
# beside two other test processes on 2 cores (43.5 s on a slower host, past 60 s in a CI run);
# so it runs alone (scripts/test.sh)
@pytest.mark.solo
def test_sigterm_to_the_running_task_preempts_it_and_attempt_2_resumes(stack, redis_server):
    # the frozen task's heartbeat thread is frozen too (4-10 s under load): with the 10 s
    # lease the reaper could end attempt 1 as lost before the SIGTERM is delivered
    stack.env["COMERA_LEASE_SECONDS"] = "60"
    stack.start("reaper", ["reaper"])
    stack.worker("worker")
    client = stack.api()
    job_id = stack.submit(client, PREEMPTED, "preempted")["id"]
    _running_at(stack, client, job_id, 5)
    control = CeleryControl(Settings(broker_url=redis_server.url))
    task, owner = f"{job_id}:1", _worker_of(stack, job_id, 1)
    child = int(owner.rpartition(":")[2])  # the pool process that runs attempt 1
    os.kill(child, signal.SIGSTOP)  # frozen: the SIGTERM stays pending until SIGCONT
    try:
        assert control.running(task, owner) is True  # inspect().active() on the worker
        assert control.running(f"{job_id}:2", owner) is False
        assert control.terminate(task, owner, "SIGTERM")  # revoke(terminate=True)
        wait_for(lambda: _pending_sigterm(child), 10, "the SIGTERM to reach the task", stack.logs)
    finally:
        os.kill(child, signal.SIGCONT)

    job = stack.wait_state(client, job_id, timeout=300)
    assert job["state"] == "SUCCEEDED", (job["error"], stack.logs())
    attempts = client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    assert [(a["attempt"], a["exit_reason"]) for a in attempts] == [
        (1, "preempted"),
        (2, "completed"),
    ]
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


def test_sigterm_to_the_worker_main_process_preempts_the_job(stack):
    """``docker stop`` / systemd: SIGTERM to the worker's main process only. Celery's warm
    shutdown alone would let the job train on to its end; the job checkpoints and is requeued
    as attempt 2 instead, and the worker exits at once."""
    stack.worker("worker")
    client = stack.api()
    job_id = stack.submit(client, LONG, "stopped")["id"]
    _running_at(stack, client, job_id, 5)
    worker = stack.procs["worker"]
    os.kill(worker.pid, signal.SIGTERM)  # not its process group: the pool child is not told
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker trained on after SIGTERM\n{stack.logs()}") from None

    job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["state"], job["attempt"]) == ("QUEUED", 2), stack.logs()
    attempts = client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    assert [(a["attempt"], a["exit_reason"]) for a in attempts] == [(1, "preempted"), (2, None)]
    items = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    [partial] = [c for c in items if c["kind"] == "partial"]
    assert partial["attempt"] == 1 and partial["state"] == "complete" and partial["step"] >= 5
    assert attempts[1]["resume_from"] == partial["id"]
