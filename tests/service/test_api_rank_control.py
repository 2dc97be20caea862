"""Rank control through the API: the guard's outcome and the chance flag reach the job
resource, its events, the report, the CLI and the dashboard; the new spec fields are bounded
like the engine's and reach it."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from api_schemas import CompressionReport, JobPublic
from api_schemas.jobs import CompressionSpec, StageSpec
from api_schemas.series import EventPublic
from client.render import job_summary, job_table, report_tables
from client.watch import JobView
from engine.train import JobConfig
from engine.train.config import CompressionConfig, StageConfig
from service.store.db.models import Job
from tests.helpers.specs import mlp_model, synthetic_dataset
from tests.service.api_helpers import Api, job_body
from worker.pipeline import run_job

LR = {"cores": 0.003, "gates": 0.01, "others": 0.003}
LEARNS = {
    "model": mlp_model(32, 32, dropout=0.0),
    "dataset": synthetic_dataset(
        n_train=512, n_valid=128, params={"shape": [16], "num_classes": 4, "noise": 0.8}
    ),
    "training": {"batch_size": 32, "log_every": 10, "seed": 3},
}


def test_new_fields_default_and_bound_as_the_engine_does():
    wire, engine = CompressionSpec(), CompressionConfig()
    assert (wire.max_metric_drop, wire.min_rank_fraction) == (
        engine.max_metric_drop,
        engine.min_rank_fraction,
    )
    assert StageSpec(kind="early", steps=1).gamma == StageConfig(kind="early", steps=1).gamma
    # the bounds agree: a value the wire takes the engine takes, one past it neither
    for value, ok in ((0.0, True), (100.0, True), (100.5, False), (-0.1, False)):
        for check in (
            lambda v: CompressionSpec(max_metric_drop=v),
            lambda v: CompressionConfig.from_dict({"max_metric_drop": v}, "compression"),
        ):
            if ok:
                check(value)
            else:
                with pytest.raises(ValueError):
                    check(value)


@pytest.mark.parametrize(
    ("schedule", "compression", "pointer"),
    [
        (
            [{"kind": "late", "steps": 5, "gamma": "auto", "target_ratio": 0.5}],
            {},
            "/schedule/0/gamma",
        ),
        (  # a fixed gamma cannot steer the size (none given: "auto")
            [{"kind": "early", "steps": 5, "target_ratio": 0.5, "gamma": 0.01}],
            {},
            "/schedule/0/target_ratio",
        ),
        ([{"kind": "finetune", "steps": 5, "target_ratio": 0.5}], {}, "/schedule/0/target_ratio"),
        ([{"kind": "early", "steps": 5}], {"max_metric_drop": -1}, "/compression/max_metric_drop"),
        (
            [{"kind": "early", "steps": 5}],
            {"min_rank_fraction": 2},
            "/compression/min_rank_fraction",
        ),
        (
            [{"kind": "late", "steps": 5, "target_ratio": 0.5, "loss_ref": 0}],
            {},
            "/schedule/0/loss_ref",
        ),
    ],
)
def test_bad_rank_control_fields_are_422_naming_the_field(api: Api, schedule, compression, pointer):
    body = job_body(schedule=schedule, compression={"max_rank": 4, **compression})
    resp = api.client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert pointer in [e["pointer"] for e in resp.json()["errors"]]


def test_auto_gamma_and_the_guard_reach_the_engine_config(api: Api):
    body = job_body(
        schedule=[
            {"kind": "early", "steps": 10, "gamma": "auto", "target_ratio": 0.5},
            {"kind": "late", "steps": 5, "target_ratio": 0.5},
        ],
        compression={"max_rank": 4, "max_metric_drop": 0.5, "min_rank_fraction": 0.5},
    )
    resp = api.client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.text
    with api.sessions() as s:
        engine = s.get(Job, resp.json()["id"]).engine_config
    assert engine["schedule"][0]["gamma"] == "auto"
    assert engine["schedule"][0]["target_ratio"] == 0.5
    assert engine["compression"]["max_metric_drop"] == 0.5
    assert engine["compression"]["min_rank_fraction"] == 0.5
    config = JobConfig.from_dict(engine)  # what the worker builds validates in the engine
    assert config.compression.max_metric_drop == 0.5 and config.schedule[0].gamma == "auto"


def _run(api: Api, body: dict[str, Any]) -> tuple[JobPublic, dict, list[dict]]:
    resp = api.client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    outcome = run_job(job_id=job_id, attempt=1, settings=api.settings, factory=api.sessions)
    assert outcome == "succeeded"
    job = JobPublic.model_validate(api.client.get(f"/v1/jobs/{job_id}").json())
    report = api.client.get(f"/v1/jobs/{job_id}/report")
    assert report.status_code == 200, report.text
    events = api.client.get(f"/v1/jobs/{job_id}/events", params={"limit": 500}).json()["items"]
    return job, report.json(), events


def _text(renderable: Any) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_guarded_stage_that_stops_says_so_everywhere(api: Api):
    body = {
        **LEARNS,
        "name": "guarded",
        "compression": {
            "max_rank": 8,
            "d": 2,
            "min_size": 256,
            "shrink_every": 5,
            "layers": ["hidden.1"],
            "max_metric_drop": 0.0,
        },
        "schedule": [
            {"kind": "early", "steps": 80, "lr": LR},
            {"kind": "late", "steps": 40, "target_ratio": 0.02, "lr": LR},
        ],
    }
    job, report, events = _run(api, body)
    assert job.state == "SUCCEEDED"
    c = job.compression
    assert c["target_reached"] is False and "fell below" in c["target_reason"]
    assert c["size_ratio_reached"] > 0.02 and c["at_chance"] is False
    assert "size target not reached" in (job.message or "")
    assert report["target"]["target_reached"] is False
    assert report["target"]["reason"] == c["target_reason"]
    assert report["chance"]["at_chance"] is False
    ends = [e for e in events if e["kind"] == "stage" and e["data"].get("phase") == "end"]
    late = [e["data"] for e in ends if e["data"].get("kind") == "late"]
    assert late and late[0]["target_reached"] is False and late[0]["reason"] == c["target_reason"]
    # the CLI: status, summary, report and the watch view say it
    assert "not reached" in _text(job_table(job)) and "not reached" in job_summary(job)
    assert "not reached" in _text(report_tables(CompressionReport.model_validate(report)))
    view = JobView()
    for e in events:
        view.apply(EventPublic.model_validate(e))
    assert any("not reached" in note for note in view.notes)


def test_a_model_at_chance_is_flagged_on_the_job_and_the_report(api: Api):
    body = {
        **LEARNS,
        "name": "frozen",
        "compression": {"max_rank": 4, "min_size": 256},
        "schedule": [{"kind": "early", "steps": 5, "lr": {"cores": 0, "gates": 0, "others": 0}}],
    }
    job, report, _ = _run(api, body)
    assert job.state == "SUCCEEDED"  # it ran as asked; the flag says what it is worth
    assert job.compression["at_chance"] is True and report["chance"]["at_chance"] is True
    assert "at chance level" in (job.message or "")
    assert "at chance level" in _text(job_table(job))


@pytest.mark.parametrize(
    ("training", "pointer"),
    [
        ({"devices": 2, "batch_size": 33}, "/training/batch_size"),
        ({"devices": 2, "nodes": 2, "batch_size": 30}, "/training/batch_size"),
        ({"devices": 2, "cuda_graph": "on", "device": "cuda"}, "/training/cuda_graph"),
        ({"devices": 65}, "/training/devices"),
        ({"nodes": 0}, "/training/nodes"),
    ],
)
def test_data_parallel_fields_are_bounded_and_checked_at_the_edge(api: Api, training, pointer):
    resp = api.client.post("/v1/jobs", json=job_body(training=training))
    assert resp.status_code == 422, resp.text
    assert pointer in [e["pointer"] for e in resp.json()["errors"]]


def test_devices_reach_the_engine_config(api: Api):
    resp = api.client.post("/v1/jobs", json=job_body(training={"devices": 2, "batch_size": 16}))
    assert resp.status_code == 202, resp.text
    with api.sessions() as s:
        engine = s.get(Job, resp.json()["id"]).engine_config
    assert (engine["training"]["devices"], engine["training"]["nodes"]) == (2, 1)
    assert JobConfig.from_dict(engine).training.devices == 2


def test_the_rank_choice_and_the_advice_reach_the_report_and_the_cli(api: Api):
    """Only a target: ``max_rank: "auto"`` calibrates, and the report carries each layer's
    choice; a rank every bond is stuck at (1) is advised against, in the report and in
    ``comera report``."""
    auto_body = {
        **LEARNS,
        "name": "auto-rank",
        "compression": {"d": 2, "min_size": 256, "layers": ["hidden.1"]},
        "schedule": [{"kind": "early", "steps": 20, "target_ratio": 0.5, "lr": LR}],
    }
    _, report, _ = _run(api, auto_body)
    auto = report["auto_rank"]
    assert set(auto["layers"]) == {"hidden.1"} and auto["probe"]["steps"] == 20
    assert auto["build_rank"] == auto["layers"]["hidden.1"]["rank"] >= 1
    assert "max_rank auto" in _text(report_tables(CompressionReport.model_validate(report)))
    stuck = {
        **LEARNS,
        "name": "rank-one",
        "compression": {"max_rank": 1, "d": 2, "min_size": 256, "layers": ["hidden.1"]},
        "schedule": [{"kind": "early", "steps": 10, "lr": LR}],
    }
    _, report, _ = _run(api, stuck)
    assert report["auto_rank"] is None
    [advice] = report["advice"]
    assert advice["code"] == "raise_max_rank" and advice["saturated"]
    text = _text(report_tables(CompressionReport.model_validate(report)))
    assert "raise max_rank" in text
