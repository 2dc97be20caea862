"""The API's planner counts the memory baseline the workers measured for a job's process
(``service.store.workers.process_baseline``, ``worker.process_baseline``; the memory plan of
docs/service.md#memory-plan), the default while none has."""

from __future__ import annotations

from datetime import timedelta

from service.store.db.models import utcnow
from service.store.workers import process_baseline, register_worker
from tests.service.api_helpers import Api, job_body
from worker.process_baseline import DEFAULT_BASELINE

MB = 1 << 20


def _register(api: Api, name: str, seen_ago: float = 0.0, **baseline: int) -> None:
    with api.sessions() as session:
        register_worker(
            session=session,
            settings=api.settings,
            name=name,
            queues=["gpu.any"],
            now=utcnow() - timedelta(seconds=seen_ago),
            baseline=baseline or None,
        )


def _baseline_bytes(api: Api) -> int:
    resp = api.client.post("/v1/jobs:validate", json=job_body())
    assert resp.status_code == 200, resp.text
    memory = resp.json()["memory"]
    assert resp.json()["estimated_memory_bytes"] == sum(
        v for k, v in memory.items() if k.endswith("_bytes") and k != "launcher_bytes"
    )
    return memory["baseline_bytes"]


def test_the_plan_counts_the_largest_baseline_of_the_workers_that_count(api: Api):
    assert _baseline_bytes(api) == DEFAULT_BASELINE.process_bytes  # none measured yet
    _register(api, "w1@a")  # registered, not measured yet
    assert _baseline_bytes(api) == DEFAULT_BASELINE.process_bytes
    _register(api, "w1@a", process_bytes=300 * MB, hf_bytes=70 * MB, launcher_bytes=200 * MB)
    _register(api, "w2@b", process_bytes=350 * MB, hf_bytes=60 * MB, launcher_bytes=210 * MB)
    ttl = api.settings.worker_ttl_seconds
    _register(api, "old@c", seen_ago=ttl + 1, process_bytes=900 * MB, hf_bytes=0, launcher_bytes=0)
    with api.sessions() as session:
        assert process_baseline(session=session, settings=api.settings) == {
            "process_bytes": 350 * MB,
            "hf_bytes": 70 * MB,
            "launcher_bytes": 210 * MB,
        }
    assert _baseline_bytes(api) == 350 * MB
    _register(api, "w2@b")  # a beat without the figures keeps them
    assert _baseline_bytes(api) == 350 * MB
