"""The planner's 422 and a failed job's problem name the same wire field for the same engine
error (both through :func:`api_schemas.engine_spec.engine_pointer`).

Before, each had its own inverse of the name map and they disagreed: for ``data.train`` the
planner answered ``/dataset/path`` and the worker ``/dataset/train`` (not a wire field); for
``version`` and ``galore.rank`` the planner ``""``, the worker ``/version`` and ``/galore/rank``.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_schemas import JobCreate
from engine.train import ConfigError
from service.planner import PlanFailed, Planner, TenantPlanner
from tests.helpers.specs import early_stage, model_spec, package, synthetic_dataset
from tests.service.api_helpers import Api, job_body
from tests.worker.jobs import factory_for, get, make_job, settings_for, tiny_spec
from worker.pipeline import run_job
from worker.problems import problem_for

UPLOAD = {"source": "upload", "dataset_id": "ds_01ABC", "format": "npz"}
PATH = {"source": "path", "path": "train.npz", "format": "npz"}
HF_PACKAGE = {
    "model": model_spec("hf_bert", source=package()),
    "dataset": synthetic_dataset("stdlib_text"),
    "schedule": [early_stage(steps=2)],
}
DEFAULT_TARGET = {
    "compression": {"max_rank": 4, "min_size": 256, "target_ratio": 0.5},
    "schedule": [{"kind": "early", "steps": 2}, {"kind": "late", "steps": 2}],
}


class AnsweringChild:
    """A stand-in planner child whose every plan fails with the engine error ``field``, as the
    real child reports a ``ConfigError`` (``service.planner_child.plan_in_child``)."""

    def __init__(self, field: str) -> None:
        self.field, self.started = field, False

    def start(self, timeout_s: float) -> None:
        self.started = True

    def submit(self, job: dict[str, Any], options: dict[str, Any]) -> Future[dict[str, Any]]:
        done: Future[dict[str, Any]] = Future()
        done.set_result({"status": "invalid", "field": self.field, "message": "refused"})
        return done

    def pids(self) -> list[int]:
        return []

    def kill(self) -> None:
        self.started = False


@pytest.mark.parametrize(
    ("field", "changes", "pointer"),
    [
        ("data.train", {"dataset": PATH}, "/dataset/path"),
        ("data.train", {"dataset": UPLOAD}, "/dataset/dataset_id"),
        ("data.kind", {"dataset": UPLOAD}, "/dataset/format"),
        ("data.shuffle_buffer", {}, "/dataset"),
        ("version", {}, ""),
        ("galore.rank", {}, ""),
        ("method", {}, "/compression/method"),
        ("checkpoint.every_steps", {}, "/checkpointing/every_n_steps"),
        ("compression.shapes", {}, "/compression/modes"),
        ("schedule[1].target_ratio", DEFAULT_TARGET, "/compression/target_ratio"),
        ("schedule[1].lr.gates", {}, "/schedule/1/lr/gates"),
        ("model.config.path", HF_PACKAGE, "/model/source/name"),
        ("model.config.distill_weight", HF_PACKAGE, "/model/distill/weight"),
    ],
)
def test_the_planner_and_a_failed_job_name_the_same_field(field, changes, pointer):
    spec = JobCreate.model_validate(job_body(**changes))
    planner = Planner(processes=1, child=lambda: AnsweringChild(field))
    tenant = TenantPlanner(planner, "t", 1, 0, 5.0, 2**30, accept_unplanned=False)
    with pytest.raises(PlanFailed) as refused:
        tenant.plan({}, spec)
    kind, problem = problem_for(ConfigError(field, "refused"), spec=spec.model_dump(mode="json"))
    assert kind == "validation"
    assert refused.value.pointer == problem["errors"][0]["pointer"] == pointer


def _pointers(resp: httpx.Response) -> list[str]:
    return [e["pointer"] for e in resp.json().get("errors", [])]


@pytest.mark.parametrize(
    ("compression", "model", "pointer"),
    [
        ({"layers": ["nothing.*"]}, None, "/compression/layers"),
        ({}, model_spec("mlp", {"hiddn": [32]}), "/model/config/hiddn"),
    ],
)
def test_a_real_engine_error_is_the_same_field_in_the_422_and_in_the_failed_job(
    api_lite: Api, sqlite_url: str, tmp_path: Path, compression, model, pointer
):
    """The API's dry run (a real planner child) and the worker's run of the same spec (the
    worker plans again before it builds anything) refuse it naming the same field."""
    body = tiny_spec(
        compression={"max_rank": 4, "min_size": 16, **compression},
        **({"model": model} if model else {}),
    )
    resp = api_lite.client.post("/v1/jobs:validate", json=body)
    assert resp.status_code == 422, resp.text
    settings, factory = settings_for(tmp_path / "worker", sqlite_url), factory_for(sqlite_url)
    job_id = make_job(factory, body)
    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "failed"
    job, _ = get(factory, job_id)
    assert job.error["type"].endswith("/validation")
    assert _pointers(resp) == [e["pointer"] for e in job.error["errors"]] == [pointer]
