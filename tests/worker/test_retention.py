"""``checkpointing.keep`` holds for the job, across attempts (worker.artifacts.enforce_keep):
after a preempted attempt and a resumed one that succeeds, only the ``keep`` newest resumable
checkpoints are left, the older attempt's files are gone and their rows say ``deleted``."""

from __future__ import annotations

import pytest

from tests.worker import jobs
from tests.worker.test_preemption import _run_preempted
from worker.callback import JobCallback
from worker.pipeline import run_job
from worker.recorder import Recorder

pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)
RESUMABLE = ("latest", "partial")


def test_keep_spans_attempts(db_url, tmp_path):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    spec = jobs.tiny_spec(checkpointing={"every_n_steps": 5, "keep": 2})
    job_id = jobs.make_job(factory, spec)
    assert _run_preempted(factory, settings, job_id) == "preempted"
    first = [c for c in jobs.checkpoints(factory, job_id) if c.kind in RESUMABLE]
    live = [c for c in first if c.state == "complete"]  # the 2 the engine kept + the partial
    assert {c.attempt for c in first} == {1} and {c.kind for c in live} == set(RESUMABLE)

    assert run_job(job_id=job_id, attempt=2, settings=settings, factory=factory) == "succeeded"
    job, (_, second) = jobs.get(factory, job_id)
    assert job.state == "SUCCEEDED" and second.exit_reason == "completed"
    rows = [c for c in jobs.checkpoints(factory, job_id) if c.kind in RESUMABLE]
    live = [c for c in rows if c.state == "complete"]
    assert len(live) == 2 and {c.attempt for c in live} == {2}
    assert max(c.step for c in live) == max(c.step for c in rows)
    for c in rows:
        assert (settings.artifacts / c.path).is_file() == (c.state == "complete"), c.path
    assert all(c.state == "deleted" for c in rows if c.attempt == 1)
    deleted = {e.data["id"] for e in jobs.events(factory, job_id) if e.kind == "checkpoint"}
    assert {c.id for c in rows if c.state == "deleted"} <= deleted
    export = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "export"]
    assert [c.state for c in export] == ["complete"]


def test_a_periodic_checkpoint_replaced_before_its_event_is_read_is_not_listed(db_url, tmp_path):
    """Training in processes of its own: the worker reads rank 0's events after the fact, by
    which time ``keep`` may have removed a periodic checkpoint. It is skipped, the next one is
    listed; a partial or final checkpoint that is missing is still an error."""
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec())
    rec = Recorder(
        factory=factory,
        job_id=job_id,
        tenant_id=jobs.TENANT,
        attempt=1,
        flush_seconds=0.0,
        flush_points=1,
    )
    cb = JobCallback(
        recorder=rec, stage_names=["early"], artifacts=settings.artifacts, tenant_id=jobs.TENANT
    )
    ckpts = settings.artifacts / "jobs" / job_id / "attempt-1" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "step-00000020.safetensors").write_bytes(b"twenty")
    cb.on_checkpoint(
        {"event": "checkpoint", "step": 10, "path": str(ckpts / "step-00000010.safetensors")}
    )
    cb.on_checkpoint(
        {"event": "checkpoint", "step": 20, "path": str(ckpts / "step-00000020.safetensors")}
    )
    rec.flush()
    assert [(c.step, c.kind, c.size_bytes) for c in jobs.checkpoints(factory, job_id)] == [
        (20, "latest", 6)
    ]
    gone = {"event": "checkpoint", "step": 25, "partial": True}
    with pytest.raises(FileNotFoundError):
        cb.on_checkpoint({**gone, "path": str(ckpts / "step-00000025-partial.safetensors")})
