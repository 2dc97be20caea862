"""Redis restarted (keeping nothing) while a job waits in its queue, and a job submitted while
it is down: no job is lost. The reaper re-sends the lost message and sends the unsent one.
(One queued job, not more: each runs in turn on the one worker, and with two queued the test
took 44-60 s on loaded 2-core machines, 17 s alone.)"""

from __future__ import annotations

import pytest

from tests.faults.stack import SPEC
from tests.helpers.groups import SERVICES

# Redis, the API, a reaper and a worker: 14 s alone, 53 s beside two other test processes on 2
# cores, past 60 s on a slower CI host; so it runs alone (scripts/test.sh)
pytestmark = [pytest.mark.slow, pytest.mark.solo, SERVICES]
SHORT = {**SPEC, "schedule": [{"kind": "early", "steps": 10}], "checkpointing": {"keep": 1}}


def test_jobs_queued_when_redis_restarts_empty_all_run(stack, redis_server):
    client = stack.api()
    queued = [stack.submit(client, SHORT, "before-restart")]
    assert not any(job["enqueue_pending"] for job in queued)  # in Redis's queue

    redis_server.kill()  # the queue is gone with it
    unsent = stack.submit(client, SHORT, "while-down")
    assert unsent["enqueue_pending"] is True  # stored, 202, sent later
    redis_server.start()  # empty
    stack.start("reaper", ["reaper"])
    stack.worker("worker")

    for job in [*queued, unsent]:
        done = stack.wait_state(client, job["id"])
        assert done["state"] == "SUCCEEDED", (done["error"], stack.logs())
        assert done["attempt"] == 1 and done["enqueue_pending"] is False
        notes = [e["data"]["message"] for e in stack.events(client, job["id"], "log")]
        note = "message sent" if job is unsent else "message lost; sent again"
        assert any(n.startswith(note) for n in notes), notes
    listed = client.get("/v1/jobs", params={"limit": 50}).json()["items"]
    assert sorted(j["id"] for j in listed) == sorted(j["id"] for j in [*queued, unsent])
    assert {j["state"] for j in listed} == {"SUCCEEDED"}
