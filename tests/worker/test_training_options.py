"""``training.precision`` / ``fast_path`` / ``cuda_graph`` in the worker: a bf16 job runs on
the CPU through a real Celery worker, and what the engine refuses fails the job as a
``validation`` problem naming the field (never a 500)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.train.config import ConfigError
from engine.train.cuda_graphs import CudaGraphUnavailableError
from service.store.queue import enqueue
from service.store.settings import Settings
from tests.worker import jobs
from tests.worker.test_celery import _queue, celery_worker, purge_redis, wait_terminal
from worker.pipeline import run_job
from worker.problems import problem_for


def tiny_spec(**training: object) -> dict:
    base = jobs.tiny_spec()
    return jobs.tiny_spec(training={**base["training"], **training})


@pytest.mark.slow
def test_a_bf16_job_runs_on_the_cpu_to_succeeded(pg_url, tmp_path):
    broker = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
    settings = Settings(home=tmp_path, database_url=pg_url, broker_url=broker, queue=_queue())
    factory, log = jobs.factory_for(pg_url), tmp_path / "worker.log"
    bf16 = jobs.make_job(factory, tiny_spec(precision="bf16", device="cpu"))
    fp32 = jobs.make_job(factory, tiny_spec(precision="fp32", device="cpu"))  # same job in fp32
    try:
        with celery_worker(settings, log):
            for job_id in (bf16, fp32):
                assert enqueue(settings=settings, job_id=job_id, attempt=1, max_wall_time_s=600)
            done = {job_id: wait_terminal(factory, job_id, log) for job_id in (bf16, fp32)}
    finally:
        purge_redis(broker, settings.queue)
    for job, [attempt] in done.values():
        assert job.state == "SUCCEEDED", (job.error, log.read_text()[-4000:])
        assert attempt.exit_reason == "completed"
    job = done[bf16][0]
    training = job.engine_config["training"]  # the config the worker ran (set at RUNNING)
    assert (training["precision"], training["fast_path"], training["cuda_graph"]) == (
        "bf16",
        True,
        "auto",
    )
    assert training["device"] == "cpu"
    running = [e.data for e in jobs.events(factory, bf16) if e.data.get("state") == "RUNNING"]
    assert running and running[0]["device"] == "cpu"
    # bf16 reached the engine: the same seeded job's training loss differs from fp32's by
    # bfloat16 rounding (8 mantissa bits), not by more
    got, ref = jobs.metric_series(factory, bf16)["loss"], jobs.metric_series(factory, fp32)["loss"]
    assert got.keys() == ref.keys() and all(math.isfinite(v) for v in got.values())
    first = min(got)
    assert got[first] != ref[first]
    assert abs(got[first] - ref[first]) <= 0.05 * abs(ref[first])
    # what ran is kept with the export (and shown by the report endpoint)
    [export] = [c for c in jobs.checkpoints(factory, bf16) if c.kind == "export"]
    ran = export.manifest["extra"]["execution"]
    assert (ran["precision"], ran["fast_path"], ran["cuda_graph"]["used"]) == ("bf16", True, False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_graph_on_fails_a_job_on_a_worker_without_a_gpu(pg_url, tmp_path):
    """``cuda_graph: on`` needs ``device: cuda`` (the API accepts it: it does not know the
    workers' devices); a worker without a GPU fails it as ``validation``, naming the field."""
    settings, factory = jobs.settings_for(tmp_path, pg_url), jobs.factory_for(pg_url)
    job_id = jobs.make_job(factory, tiny_spec(device="cuda", cuda_graph="on"))
    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "failed"
    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == "validation"
    assert job.error["status"] == 422 and job.error["retryable"] is False
    assert [e["pointer"] for e in job.error["errors"]] == ["/training/device"]
    assert "no GPU" in job.error["detail"]


@pytest.mark.parametrize(
    ("exc", "pointer"),
    [
        (ConfigError("training.cuda_graph", "CUDA is not available"), "/training/cuda_graph"),
        (
            ConfigError(
                "training.precision",
                "bf16 runs TT layers through the fast path, which this model cannot use",
            ),
            "/training/precision",
        ),
        (
            CudaGraphUnavailableError("capturing the training step failed: sync"),
            "/training/cuda_graph",
        ),
    ],
)
def test_engine_refusals_of_the_options_are_validation_problems(exc, pointer):
    kind, problem = problem_for(exc)
    assert kind == "validation"
    assert problem["status"] == 422 and problem["retryable"] is False
    assert problem["type"].endswith("/validation")
    assert [e["pointer"] for e in problem["errors"]] == [pointer]
    assert pointer.rsplit("/", 1)[1] in problem["detail"]
