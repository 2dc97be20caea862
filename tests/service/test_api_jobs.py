"""Submitting jobs: 202 + Location, validation errors as JSON Pointers, the planner's checks,
dataset references and the enqueue outbox."""

from __future__ import annotations

import importlib.util

import pytest
from sqlalchemy import select

from service.store.db.models import Job, JobAttempt, JobEvent
from tests.helpers.specs import model_spec
from tests.service.api_helpers import Api, job_body, make_job


def _pointers(resp) -> list[str]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return [e["pointer"] for e in resp.json()["errors"]]


def test_submit_returns_202_location_and_the_stored_job(api: Api):
    resp = api.client.post("/v1/jobs", json=job_body(labels={"team": "nlp"}))
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert resp.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] == "QUEUED" and job["attempt"] == 1 and job["version"] == 1
    assert job["enqueue_pending"] is False and job["labels"] == {"team": "nlp"}
    assert job["spec"]["training"]["batch_size"] == 32  # normalized: defaults filled
    sent = {"job_id": job["id"], "attempt": 1, "max_wall_time_s": 21600, "devices": 1, "nodes": 1}
    assert api.enqueued == [sent]
    got = api.client.get(resp.headers["location"])
    assert got.status_code == 200 and got.json()["id"] == job["id"]
    assert got.json()["links"]["events"] == f"/v1/jobs/{job['id']}/events"
    with api.sessions() as s:
        row = s.get(Job, job["id"])
        assert row.engine_config["model"]["arch"] == "mlp" and row.enqueued_at is not None
        assert [a.attempt for a in s.scalars(select(JobAttempt))] == [1]
        assert [e.data["state"] for e in s.scalars(select(JobEvent))] == ["QUEUED"]


def test_broker_down_still_accepts_and_flags_enqueue_pending(api: Api):
    api.send_ok = False
    resp = api.client.post("/v1/jobs", json=job_body())
    assert resp.status_code == 202 and resp.json()["enqueue_pending"] is True
    assert api.client.get(resp.headers["location"]).json()["enqueue_pending"] is True


@pytest.mark.skipif(
    importlib.util.find_spec("service.store.queue") is None,
    reason="service.store.queue is not there yet",
)
def test_real_queue_with_unreachable_broker_gives_enqueue_pending(api_lite: Api):
    from service.api.deps import get_enqueue

    app = api_lite.client.app
    del app.dependency_overrides[get_enqueue]  # the real service.store.queue.enqueue
    app.state.settings = api_lite.settings.model_copy(
        update={"broker_url": "redis://127.0.0.1:1/0"}
    )
    resp = api_lite.client.post("/v1/jobs", json=job_body())
    assert resp.status_code == 202 and resp.json()["enqueue_pending"] is True


def test_422_lists_every_failing_field_with_json_pointers(api_lite: Api):
    body = job_body(name="!bad", labels={"a/b": 1})
    body["model"]["foo"] = 1  # unknown field
    body["schedule"] = [
        {"kind": "early", "steps": 0},
        {"kind": "late", "steps": 5, "target_ratio": 1.5},
    ]
    body["training"] = {"batch_size": 0}
    resp = api_lite.client.post("/v1/jobs", json=body)
    errors = {e["pointer"]: e for e in resp.json()["errors"]}
    assert set(_pointers(resp)) == {
        "/name",
        "/labels/a~1b",
        "/model/foo",
        "/schedule/0/steps",
        "/schedule/1/target_ratio",
        "/training/batch_size",
    }
    assert errors["/model/foo"]["code"] == "extra_forbidden"
    assert errors["/schedule/1/target_ratio"]["code"] == "less_than"
    assert api_lite.enqueued == []


def test_422_for_model_validators_missing_fields_and_union_values(api_lite: Api):
    body = job_body(dataset={"source": "upload", "format": "jsonl"})
    body["model"]["config"] = {"hidden": {"not": "a list"}}
    del body["schedule"][0]["steps"]
    resp = api_lite.client.post("/v1/jobs", json=body)
    assert set(_pointers(resp)) == {"/dataset", "/model/config/hidden", "/schedule/0"}
    assert "dataset_id is required" in resp.text
    missing = api_lite.client.post("/v1/jobs", json={"name": "x"})
    assert set(_pointers(missing)) == {"/model", "/schedule"}
    assert all(e["code"] == "missing" for e in missing.json()["errors"])


def test_malformed_json_is_400_and_engine_refusals_name_the_field(api_lite: Api):
    bad = api_lite.client.post(
        "/v1/jobs", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400 and bad.json()["errors"][0]["code"] == "json_invalid"
    resp = api_lite.client.post(
        "/v1/jobs", json=job_body(training={"precision": "bf16", "fast_path": False})
    )
    assert _pointers(resp) == ["/training/precision"]


@pytest.mark.slow
def test_stage_that_does_not_fit_the_model_is_422_via_the_planner(api: Api):
    body = job_body()
    del body["schedule"][1]["target_ratio"]  # a late stage needs a target (engine rule)
    assert _pointers(api.client.post("/v1/jobs", json=body)) == ["/schedule/1/target_ratio"]
    body = job_body(compression={"layers": ["encoder.*"]})  # matches no layer of an MLP
    resp = api.client.post("/v1/jobs", json=body)
    assert _pointers(resp) == ["/compression/layers"] and "hidden.0" in resp.text
    early = job_body(schedule=[{"kind": "early", "steps": 3, "target_ratio": 0.5, "gamma": 0.01}])
    assert _pointers(api.client.post("/v1/jobs", json=early)) == ["/schedule/0/target_ratio"]
    with api.sessions() as s:
        assert s.scalars(select(Job)).first() is None  # nothing stored
    assert api.enqueued == []


@pytest.mark.slow
def test_validate_is_a_dry_run_with_the_plan(api_lite: Api):
    resp = api_lite.client.post("/v1/jobs:validate", json=job_body())
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["spec"]["training"]["seed"] == 0
    assert [layer["name"] for layer in report["layers"]] == ["hidden.0", "hidden.1"]
    first = report["layers"][0]
    assert first["kind"] == "tt_linear" and first["initial_ranks"][0] == 1
    assert max(first["initial_ranks"]) <= 4 and first["params"] < first["dense_params"]
    assert report["params_after"] < report["params_before"]
    assert report["total_steps"] == 10 and report["estimated_memory_bytes"] > 16 * 1000
    assert report["tensorized_ratio"] > 1
    with api_lite.sessions() as s:
        assert s.scalars(select(Job)).first() is None
    bad = job_body(compression={"layers": ["nothing*"]})
    assert _pointers(api_lite.client.post("/v1/jobs:validate", json=bad)) == ["/compression/layers"]


def test_dataset_references_are_resolved_at_submission(api: Api):
    missing = job_body(dataset={"source": "upload", "dataset_id": "ds_01ABC", "format": "npz"})
    assert _pointers(api.client.post("/v1/jobs", json=missing)) == ["/dataset/dataset_id"]
    absent = job_body(dataset={"source": "path", "path": "nope.npz", "format": "npz"})
    assert _pointers(api.client.post("/v1/jobs", json=absent)) == ["/dataset/path"]
    api.settings.data.mkdir(parents=True, exist_ok=True)
    outside = api.settings.data / "link.npz"
    outside.symlink_to(api.settings.home / "comera.db")  # escapes the data root
    escaping = job_body(dataset={"source": "path", "path": "link.npz", "format": "npz"})
    resp = api.client.post("/v1/jobs", json=escaping)
    assert _pointers(resp) == ["/dataset/path"] and "data root" in resp.text
    dotdot = job_body(dataset={"source": "path", "path": "../x.npz", "format": "npz"})
    assert _pointers(api.client.post("/v1/jobs", json=dotdot)) == ["/dataset/path"]


def test_too_many_queued_jobs_is_429(api_lite: Api):
    app = api_lite.client.app
    app.state.settings = api_lite.settings.model_copy(update={"max_queued_jobs_per_tenant": 2})
    make_job(api_lite)
    make_job(api_lite, state="RUNNING")  # only QUEUED jobs count
    assert api_lite.client.post("/v1/jobs", json=job_body()).status_code == 202
    resp = api_lite.client.post("/v1/jobs", json=job_body())
    assert resp.status_code == 429 and resp.headers["retry-after"] == "60"


def test_explicit_modes_reach_the_plan_and_bad_ones_name_the_field(api_lite: Api):
    modes = {"hidden.0": {"in": [4, 4, 4], "out": [4, 4, 4]}}
    body = job_body(compression={"max_rank": 4, "min_size": 256, "modes": modes})
    resp = api_lite.client.post("/v1/jobs:validate", json=body)
    assert resp.status_code == 200, resp.text
    first = resp.json()["layers"][0]
    assert first["name"] == "hidden.0"
    assert first["modes"] in ({"in": [4, 4, 4], "out": [4, 4, 4]}, [[4, 4, 4], [4, 4, 4]])
    assert resp.json()["spec"]["compression"]["modes"] == modes
    uneven = job_body(compression={"modes": {"hidden.0": {"in": [4, 4], "out": [4, 4, 4]}}})
    assert "/compression/modes/hidden.0" in _pointers(api_lite.client.post("/v1/jobs", json=uneven))
    small = job_body(
        compression={"min_size": 256, "modes": {"hidden.0": {"in": [2, 2], "out": [4, 4]}}}
    )
    assert _pointers(api_lite.client.post("/v1/jobs:validate", json=small)) == [
        "/compression/modes"
    ]


UPPER_LIMITS = [  # (changes to job_body, pointer, code): one past each upper bound
    ({"schedule": [{"kind": "early", "steps": 1_000_001}]}, "/schedule/0/steps", "less_than_equal"),
    ({"schedule": [{"kind": "early", "epochs": 1001}]}, "/schedule/0/epochs", "less_than_equal"),
    (
        {"schedule": [{"kind": "early", "steps": 5, "warmup_steps": 1_000_001}]},
        "/schedule/0/warmup_steps",
        "less_than_equal",
    ),
    (
        {"schedule": [{"kind": "early", "steps": 5, "eval_every": 1_000_001}]},
        "/schedule/0/eval_every",
        "less_than_equal",
    ),
    ({"schedule": [{"kind": "early", "steps": 5}] * 17}, "/schedule", "too_long"),
    ({"training": {"batch_size": 4097}}, "/training/batch_size", "less_than_equal"),
    ({"training": {"log_every": 100_001}}, "/training/log_every", "less_than_equal"),
    ({"training": {"eval_batches": 100_001}}, "/training/eval_batches", "less_than_equal"),
    ({"training": {"grad_clip": 1e6 + 1}}, "/training/grad_clip", "less_than_equal"),
    ({"compression": {"max_rank": 1025}}, "/compression/max_rank", "less_than_equal"),
    (
        {"compression": {"embedding_max_rank": 1025}},
        "/compression/embedding_max_rank",
        "less_than_equal",
    ),
    ({"compression": {"d": 7}}, "/compression/d", "less_than_equal"),
    ({"compression": {"min_size": 2**40 + 1}}, "/compression/min_size", "less_than_equal"),
    ({"compression": {"shrink_every": 1_000_001}}, "/compression/shrink_every", "less_than_equal"),
    ({"compression": {"layers": ["a"] * 65}}, "/compression/layers", "too_long"),
    (
        {"compression": {"modes": {"hidden.0": {"in": [65537], "out": [2]}}}},
        "/compression/modes/hidden.0/in/0",
        "less_than_equal",
    ),
    ({"dataset": {"max_len": 2049}}, "/dataset/max_len", "less_than_equal"),
    ({"dataset": {"vocab_size": 250_001}}, "/dataset/vocab_size", "less_than_equal"),
    ({"dataset": {"n_train": 10_000_001}}, "/dataset/n_train", "less_than_equal"),
    ({"dataset": {"n_valid": 1_000_001}}, "/dataset/n_valid", "less_than_equal"),
    ({"dataset": {"num_rows": 50_000_001}}, "/dataset/num_rows", "less_than_equal"),
    ({"dataset": {"valid_every": 1001}}, "/dataset/valid_every", "less_than_equal"),
    (
        {"limits": {"max_wall_time_s": 7 * 24 * 3600 + 1}},
        "/limits/max_wall_time_s",
        "less_than_equal",
    ),
    ({"limits": {"max_attempts": 11}}, "/limits/max_attempts", "less_than_equal"),
    ({"checkpointing": {"keep": 21}}, "/checkpointing/keep", "less_than_equal"),
    (
        {"checkpointing": {"every_n_steps": 1_000_001}},
        "/checkpointing/every_n_steps",
        "less_than_equal",
    ),
    ({"labels": {f"k{i}": "v" for i in range(33)}}, "/labels", "too_long"),
    ({"name": "n" * 129}, "/name", "string_too_long"),
    (
        {"model": model_spec("mlp", {f"k{i}": 1 for i in range(65)})},
        "/model/config",
        "too_long",
    ),
]


@pytest.mark.parametrize(
    ("changes", "pointer", "code"), UPPER_LIMITS, ids=[p for _, p, _ in UPPER_LIMITS]
)
def test_422_one_past_each_upper_limit(api_lite: Api, changes: dict, pointer: str, code: str):
    errors = {
        e["pointer"]: e
        for e in api_lite.client.post("/v1/jobs", json=job_body(**changes)).json().get("errors", [])
    }
    assert pointer in errors and errors[pointer]["code"] == code, errors
    assert all(pointer.startswith(p) for p in errors), errors  # (union: also the parent)
    assert api_lite.enqueued == []


@pytest.mark.parametrize("value", ["12", True, 12.0, "1e3"])
def test_integer_fields_are_not_coerced(api_lite: Api, value):
    """``steps: "12"`` or ``true`` is a 422 naming the field, not 12 or 1 steps."""
    body = job_body(training={"batch_size": value})
    body["schedule"][0]["steps"] = value
    resp = api_lite.client.post("/v1/jobs", json=body)
    errors = {e["pointer"]: e["code"] for e in resp.json()["errors"]}
    assert set(_pointers(resp)) == {"/schedule/0/steps", "/training/batch_size"}
    assert set(errors.values()) == {"int_type"}
    assert api_lite.enqueued == []
