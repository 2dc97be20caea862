"""A checkpoint write that fails half-way (the worker runs under a file size limit, so the
write stops with EFBIG as on a full disk): no checkpoint is recorded for it, and the job fails
with a problem that says what happened."""

from __future__ import annotations

import sys

import pytest

from tests.faults.stack import SPEC
from tests.helpers.groups import SERVICES

pytestmark = [pytest.mark.slow, SERVICES]
LIMIT = 16 * 1024  # bytes per file: a checkpoint of SPEC is about 22 KB, nothing else > 4 KB
# exec the worker under RLIMIT_FSIZE (Python ignores SIGXFSZ: a write past it fails, EFBIG)
LIMITED = (
    sys.executable,
    "-c",
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "os.execv(sys.argv[2], sys.argv[2:])",
    str(LIMIT),
)


def test_a_checkpoint_that_cannot_be_written_fails_the_job_and_is_not_recorded(stack):
    stack.start("reaper", ["reaper"])
    stack.worker("worker", wrap=LIMITED, pipe=True)
    client = stack.api()
    job_id = stack.submit(client, SPEC, "file-too-large")["id"]

    job = stack.wait_state(client, job_id)
    assert job["state"] == "FAILED", stack.logs()
    error = job["error"]
    assert error["type"] == "https://comera.dev/problems/storage"
    assert error["detail"] == "writing a checkpoint failed: File too large (EFBIG)"
    assert error["status"] == 507 and error["retryable"] is True and error["step"] == 10
    attempts = client.get(f"/v1/jobs/{job_id}/attempts").json()["items"]
    assert [(a["attempt"], a["exit_reason"]) for a in attempts] == [(1, "storage")]
    assert client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"] == []  # none recorded

    # and no file of it is left behind (the writer removes its temporary file)
    folder = stack.tmp / "home" / "artifacts" / "jobs" / job_id / "attempt-1" / "checkpoints"
    assert not folder.exists() or list(folder.iterdir()) == []
    series = client.get(f"/v1/jobs/{job_id}/metrics", params={"keys": "loss"}).json()["series"]
    assert [p["step"] for p in series[0]["points"]] == [5, 10]  # measured up to the failure
    assert stack.procs["worker"].poll() is None  # the worker itself carries on
