"""The ``oom`` failure class (worker.problems): which exceptions are out-of-memory, and a real
job whose model does not fit its worker's memory ending FAILED with that problem.

The job runs through the real pipeline (``run_job``) in a child process whose address space is
capped (``RLIMIT_AS``) a little above what it holds once imported: the engine's allocation of
the model then fails honestly, as on a worker with too little memory, without this machine
ever committing the memory (the refused ``mmap`` never touches a page).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.services import run_python
from tests.helpers.specs import mlp_model
from tests.worker.jobs import factory_for, get, make_job, settings_for, tiny_spec
from worker.problems import problem_for

ROOT = Path(__file__).resolve().parents[2]
HEADROOM = 512 << 20  # bytes of address space the child may still map after its imports


def _real(make) -> BaseException:
    """The exception ``make()`` really raises."""
    try:
        make()
    except BaseException as exc:  # noqa: BLE001 (returned to the test)
        return exc
    raise AssertionError(f"{make} did not raise")


def _assert_oom(exc: BaseException) -> dict:
    kind, problem = problem_for(exc, step=7, stage="early")
    assert kind == "oom"
    assert problem["type"] == "https://comera.dev/problems/oom"
    assert (problem["status"], problem["retryable"]) == (507, False)
    assert problem["title"] == "Out of memory"
    assert (problem["step"], problem["stage"]) == (7, "early")
    assert "errors" not in problem
    return problem


def test_memory_error_is_oom_not_retried():
    assert _assert_oom(MemoryError())["detail"] == "MemoryError"
    assert _assert_oom(MemoryError("cannot grow the buffer"))["detail"] == "cannot grow the buffer"


def test_cuda_out_of_memory_error_is_oom():
    msg = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)"
    assert _assert_oom(torch.cuda.OutOfMemoryError(msg))["detail"] == msg


def test_real_failed_allocations_are_oom():
    """1 PiB exceeds any x86-64 user address space: refused at once, whatever the overcommit
    policy. numpy raises a MemoryError subclass; torch's CPU allocator a plain RuntimeError."""
    _assert_oom(_real(lambda: np.empty(1 << 50, dtype=np.uint8)))
    exc = _real(lambda: torch.empty(1 << 50, dtype=torch.uint8))
    assert type(exc) is RuntimeError  # not an OutOfMemoryError: matched by its message
    assert "you tried to allocate" in _assert_oom(exc)["detail"]


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x2)"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        ValueError("DefaultCPUAllocator: can't allocate memory"),  # not what the allocator raises
    ],
)
def test_other_errors_are_not_oom(exc: BaseException):
    kind, problem = problem_for(exc)
    assert kind == "error" and problem["status"] == 500 and problem["retryable"] is True


CHILD = """
import os, resource, sys
from pathlib import Path

import torch  # noqa: F401  (mapped before the cap: the libraries are not the job's memory)
import engine.train, worker.training  # noqa: F401,E401  (imported lazily by run_job)
from tests.worker.jobs import factory_for, settings_for
from worker.pipeline import run_job

url, home, job_id, headroom = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
settings, factory = settings_for(home, url), factory_for(url)
factory().close()  # the store's connection pool, before the cap
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
          if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, resource.RLIM_INFINITY))
print("outcome:", run_job(job_id=job_id, attempt=1, settings=settings, factory=factory))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_a_job_whose_model_does_not_fit_fails_as_oom(sqlite_url, tmp_path):
    """A dense MLP with two 16384-wide layers (282 M parameters, 1.1 GB of float32 weights,
    within the API's size limits) on a worker with 512 MiB to spare: FAILED, ``oom``, 507,
    not retryable, no export; the attempt's exit reason is ``oom``."""
    spec = tiny_spec(
        model=mlp_model(16384, 16384),
        compression={"method": "dense"},
        schedule=[{"kind": "early", "steps": 2}],
    )
    factory = factory_for(sqlite_url)
    job_id = make_job(factory, spec)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "HOME": str(tmp_path),
    }
    args = ("-c", CHILD, sqlite_url, str(tmp_path / "home"), job_id, str(HEADROOM))
    child = run_python(*args, env=env, timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    assert "outcome: failed" in child.stdout, (child.stdout, child.stderr[-4000:])
    job, [attempt] = get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == "oom", job.error
    error = job.error
    assert error["type"].endswith("/oom") and error["status"] == 507
    assert error["retryable"] is False and "allocate" in error["detail"]
    assert str(tmp_path) not in error["detail"]
    settings = settings_for(tmp_path / "home", sqlite_url)
    exports = list(Path(settings.artifacts).rglob("*.safetensors"))
    assert exports == []
