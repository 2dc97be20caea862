"""Every job runs inside a memory budget, on a real worker (the memory limit of
docs/service.md#limits).

One Celery worker (prefork, one job at a time, a fresh child per job) is given, in order:

1. tenant a's memory bomb: a 437 KB NPZ whose ``x.npy`` declares a Fortran-ordered
   (25,000,000 x 4) float32 array (1,573 MB in the worker before). The worker's own plan
   refuses it before reading a row: FAILED ``validation`` naming ``/dataset/path``, in seconds;
2. tenant a's job that passes the plan (its estimate is within the worker's capacity) but
   needs more than the process's hard cap (``job_memory_cap_bytes``): FAILED ``oom``, the
   allocation refused inside the job's own process;
3. tenant b's ordinary job: SUCCEEDED on the same worker, which is still running.

The jobs are stored as the API would have stored them, without the API's plan (as with
``accept_unplanned_jobs``), so the worker's checks are what is tested.
"""

from __future__ import annotations

import time
import zipfile

import pytest

from service.store.db.migrate import upgrade
from service.store.db.models import Tenant
from service.store.db.session import session_scope
from service.store.queue import enqueue
from service.store.settings import Settings
from tests.engine.data.test_npy_fortran import write_zeros_npz
from tests.helpers.groups import SERVICES
from tests.helpers.specs import mlp_model
from tests.worker.jobs import factory_for, make_job, tiny_spec
from tests.worker.test_celery import _queue, celery_worker, wait_terminal

CAP = 256 << 20  # the hard cap on a job's process, above its size at start
pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)


def _move_to_tenant(factory, job_id: str, tenant: str) -> None:
    from sqlalchemy import update

    from service.store.db.models import Job, JobAttempt

    with session_scope(factory) as s:
        if s.get(Tenant, tenant) is None:
            s.add(Tenant(id=tenant, name=tenant))
            s.flush()
        s.execute(update(Job).where(Job.id == job_id).values(tenant_id=tenant))
        s.execute(update(JobAttempt).where(JobAttempt.job_id == job_id).values(tenant_id=tenant))


# a worker and three jobs, each in a fresh child: 19-24 s alone, 31-39 s beside two other test
# processes on 2 cores; so it runs alone (scripts/test.sh)
@pytest.mark.slow
@pytest.mark.solo
@SERVICES
def test_a_bomb_and_an_oom_job_fail_alone_and_another_tenants_job_succeeds(tmp_path, monkeypatch):
    monkeypatch.setenv("COMERA_JOB_MEMORY_CAP_BYTES", str(CAP))
    settings = Settings(home=tmp_path, queue=_queue())
    settings.ensure_dirs()
    upgrade(settings.db_url)
    factory, log = factory_for(settings.db_url), tmp_path / "worker.log"
    write_zeros_npz(settings.data / "bomb.npz", 25_000_000, 4, compress=zipfile.ZIP_DEFLATED)
    assert (settings.data / "bomb.npz").stat().st_size < 1 << 20

    bomb = make_job(
        factory,
        tiny_spec(
            model=mlp_model(16),
            dataset={"source": "path", "path": "bomb.npz", "format": "npz"},
            schedule=[{"kind": "early", "steps": 2}],
            checkpointing={"keep": 1},
        ),
    )
    # dense, 3 x 4096 hidden: 33.6 M parameters, ~540 MB of weights, gradients and Adam
    # state: within the worker's 16 GiB capacity, over the 256 MiB cap
    hungry = make_job(
        factory,
        tiny_spec(
            model=mlp_model(4096, 4096, 4096),
            compression={"method": "dense"},
            schedule=[{"kind": "early", "steps": 3}],
            checkpointing={"keep": 1},
        ),
    )
    other = make_job(factory, tiny_spec())
    for job_id in (bomb, hungry):
        _move_to_tenant(factory, job_id, "ten_a")
    _move_to_tenant(factory, other, "ten_b")

    with celery_worker(settings, log) as proc:
        start = time.monotonic()
        for job_id in (bomb, hungry, other):
            assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600)
        job, [attempt] = wait_terminal(factory, bomb, log)
        bomb_s = time.monotonic() - start
        assert (job.state, attempt.exit_reason) == ("FAILED", "validation"), job.error
        assert job.error["errors"][0]["pointer"] == "/dataset/path", job.error
        assert "cannot be read by rows" in job.error["errors"][0]["message"]
        assert str(settings.data) not in str(job.error)  # no server path in the problem

        job, [attempt] = wait_terminal(factory, hungry, log)
        assert (job.state, attempt.exit_reason) == ("FAILED", "oom"), (job.error, log)
        assert job.error["type"] == "https://comera.dev/problems/oom"

        job, [attempt] = wait_terminal(factory, other, log, timeout=240)
        assert job.state == "SUCCEEDED", log.read_text()[-4000:]
        assert job.tenant_id == "ten_b"
        assert proc.poll() is None  # the worker itself never went down
    assert bomb_s < 60, f"the bomb took {bomb_s:.0f} s to be refused"
