"""The per-process memory baseline (``worker.process_baseline``): measured by the worker's
registration thread once per host, exported to the pool's children and read by their plans."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from service.store.db.session import make_engine, make_sessionmaker
from service.store.settings import Settings
from service.store.workers import process_baseline
from tests.helpers.specs import early_stage, engine_job, mlp_model, synthetic_data
from worker.plan import plan_job
from worker.process_baseline import ENV, ProcessBaseline, host_baseline, known_baseline
from worker.registration import Registration

JOB = engine_job(
    name="mlp",
    method="comera",
    model=mlp_model(16),
    data=synthetic_data(n_train=64, n_valid=16, params={"shape": [4, 4]}),
    compression={"max_rank": 2, "min_size": 16},
    schedule=[early_stage(steps=2)],
    training={"batch_size": 16},
)


@pytest.mark.slow
def test_the_worker_measures_the_baseline_once_per_host_and_its_children_plan_with_it(
    tmp_path, monkeypatch, sqlite_url
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's host cache
    monkeypatch.setenv(ENV, "")  # nothing measured yet: the default
    settings = Settings(home=tmp_path / "home", database_url=sqlite_url)
    registration = Registration(settings, "w@host", ["gpu.any"])
    registration.measure_baseline()
    baseline = registration.baseline
    assert baseline is not None and baseline.measured
    # torch and the engine, and the first step's imports; the launcher imported torch only
    assert 200 << 20 < baseline.launcher_bytes < baseline.process_bytes < 1 << 30
    assert 0 <= baseline.hf_bytes < 256 << 20
    assert ProcessBaseline.from_dict(json.loads(os.environ[ENV])) == baseline  # exported
    assert known_baseline() == baseline
    memory = plan_job(JOB)["memory"]  # as a child forked after the measurement plans
    assert memory["baseline_bytes"] == baseline.process_bytes
    registration.beat()  # the row carries it, for the API's planner
    factory = make_sessionmaker(make_engine(settings.db_url))
    with factory() as session:
        assert process_baseline(session=session, settings=settings) == {
            k: getattr(baseline, k) for k in ("process_bytes", "hf_bytes", "launcher_bytes")
        }
    [cached] = list(tmp_path.glob("comera-process-baseline-*.json"))
    cached.write_text(json.dumps({**baseline.to_dict(), "process_bytes": 123 << 20}))
    assert host_baseline().process_bytes == 123 << 20  # a worker started later measures nothing
