"""``training.fast_path``, ``precision`` and ``cuda_graph`` on the wire: accepted values are
stored and passed to the engine config, bad values and refused combinations are 422s naming
the field, and nothing is stored for a refused job."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from api_schemas import JobCreate
from api_schemas.engine_spec import SpecError, to_engine
from engine.train.config import TrainingConfig
from service.store.db.models import Job
from tests.helpers.specs import model_spec, transformer_model
from tests.service.api_helpers import Api, job_body

OPTIONS = ("fast_path", "precision", "cuda_graph")


def _problem(resp) -> dict[str, dict[str, Any]]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return {e["pointer"]: e for e in resp.json()["errors"]}


def _nothing_stored(api: Api) -> None:
    with api.sessions() as s:
        assert s.scalars(select(Job)).first() is None
    assert api.enqueued == []


def test_defaults_match_the_engine(api: Api):
    resp = api.client.post("/v1/jobs", json=job_body())
    assert resp.status_code == 202, resp.text
    spec = api.client.get(resp.headers["location"]).json()["spec"]["training"]
    engine = TrainingConfig()
    assert {k: spec[k] for k in OPTIONS} == {k: getattr(engine, k) for k in OPTIONS}
    assert (spec["fast_path"], spec["precision"], spec["cuda_graph"]) == (True, "fp32", "auto")


@pytest.mark.parametrize(
    "training",
    [
        {"precision": "bf16", "fast_path": True, "cuda_graph": "off"},
        {"precision": "bf16", "cuda_graph": "auto"},
        {"precision": "fp32", "fast_path": False, "cuda_graph": "off"},
        {"device": "cuda", "cuda_graph": "on"},  # accepted; a worker without a GPU fails it
    ],
)
def test_accepted_values_round_trip_and_reach_the_engine_config(api: Api, training):
    resp = api.client.post("/v1/jobs", json=job_body(training=training))
    assert resp.status_code == 202, resp.text
    got = api.client.get(resp.headers["location"])
    assert got.status_code == 200
    spec = got.json()["spec"]["training"]
    assert {k: spec[k] for k in training} == training
    with api.sessions() as s:
        engine = s.get(Job, resp.json()["id"]).engine_config["training"]
    assert {k: engine[k] for k in OPTIONS} == {k: spec[k] for k in OPTIONS}
    # what the worker builds from the stored spec validates in the engine as well
    built = TrainingConfig.from_dict(engine, "training")
    assert (built.fast_path, built.precision, built.cuda_graph) == (
        spec["fast_path"],
        spec["precision"],
        spec["cuda_graph"],
    )


@pytest.mark.parametrize(
    ("training", "pointer"),
    [
        ({"precision": "fp16"}, "/training/precision"),
        ({"precision": "BF16"}, "/training/precision"),
        ({"cuda_graph": "yes"}, "/training/cuda_graph"),
        ({"cuda_graph": True}, "/training/cuda_graph"),
        ({"fast_path": "yes"}, "/training/fast_path"),
        ({"fast_path": 1}, "/training/fast_path"),  # strict: a boolean, not a number
        ({"fast_path": None}, "/training/fast_path"),
    ],
)
def test_bad_values_are_422_naming_the_field(api: Api, training, pointer):
    errors = _problem(api.client.post("/v1/jobs", json=job_body(training=training)))
    assert list(errors) == [pointer]
    _nothing_stored(api)


def test_bf16_without_the_fast_path_is_422(api: Api):
    body = job_body(training={"precision": "bf16", "fast_path": False})
    errors = _problem(api.client.post("/v1/jobs", json=body))
    assert list(errors) == ["/training/precision"]
    assert "fast_path" in errors["/training/precision"]["message"]
    resp = api.client.post("/v1/jobs:validate", json=body)  # the dry run says the same
    assert list(_problem(resp)) == ["/training/precision"]
    _nothing_stored(api)


@pytest.mark.parametrize("device", ["cpu", "auto", None])
def test_cuda_graph_on_without_a_cuda_device_is_422(api: Api, device):
    training = {"cuda_graph": "on", **({"device": device} if device else {})}
    errors = _problem(api.client.post("/v1/jobs", json=job_body(training=training)))
    assert list(errors) == ["/training/cuda_graph"]
    assert "cuda" in errors["/training/cuda_graph"]["message"]
    _nothing_stored(api)


def test_cuda_graph_on_with_galore_is_422(api: Api):
    body = job_body(
        compression={"method": "galore"}, training={"device": "cuda", "cuda_graph": "on"}
    )
    body["schedule"] = [{"kind": "early", "steps": 5}]
    errors = _problem(api.client.post("/v1/jobs", json=body))
    assert list(errors) == ["/training/cuda_graph"]
    assert "GaLoreAdamW" in errors["/training/cuda_graph"]["message"]
    _nothing_stored(api)


@pytest.mark.parametrize(
    ("training", "device", "pointer"),
    [
        ({"cuda_graph": "on", "device": "cuda"}, "cpu", "/training/device"),  # worker without GPU
        ({"cuda_graph": "on", "device": "cuda"}, "cuda", None),
        ({"precision": "bf16"}, "cpu", None),
        ({"precision": "bf16", "cuda_graph": "off"}, "cuda", None),
        ({"fast_path": False}, "cpu", None),
    ],
)
def test_to_engine_passes_the_options_or_names_the_field(training, device, pointer):
    """The translation alone (no planner): what it passes the engine's ``TrainingConfig``
    takes; what it refuses names the field."""
    spec = JobCreate.model_validate(job_body(training=training))
    if pointer is not None:
        with pytest.raises(SpecError) as err:
            to_engine(spec, device=device)
        assert err.value.pointer == pointer
        return
    engine = to_engine(spec, device=device)["training"]
    built = TrainingConfig.from_dict(engine, "training")
    want = {k: getattr(spec.training, k) for k in OPTIONS}
    assert {k: getattr(built, k) for k in OPTIONS} == want and built.device == device


TINY_TRANSFORMER = transformer_model(
    vocab_size=1000, d_model=64, d_ff=128, max_len=64, num_classes=3
)


def test_length_buckets_reach_the_engine_data_config(api: Api):
    from engine.data.config import DataConfig

    body = job_body(model=TINY_TRANSFORMER, dataset={"length_buckets": 8, "max_len": 64})
    resp = api.client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.text
    assert api.client.get(resp.headers["location"]).json()["spec"]["dataset"]["length_buckets"] == 8
    with api.sessions() as s:
        engine = s.get(Job, resp.json()["id"]).engine_config["data"]
    assert engine["length_buckets"] == 8
    assert DataConfig(**engine).length_buckets == 8  # the worker's config validates


@pytest.mark.parametrize(
    ("changes", "pointer", "text"),
    [
        ({"dataset": {"length_buckets": 1025}}, "/dataset/length_buckets", "less than or equal"),
        ({"dataset": {"length_buckets": -1}}, "/dataset/length_buckets", "greater than or equal"),
        (
            {
                "dataset": {"length_buckets": 4, "generator": "criteo"},
                "model": model_spec("dlrm", {}),
            },
            "/dataset",
            "length_buckets",
        ),
        ({"dataset": {"length_buckets": 4}}, "", "dataset.length_buckets: 'mlp'"),
    ],
)
def test_length_buckets_without_lengths_are_422(api: Api, changes, pointer, text):
    errors = _problem(api.client.post("/v1/jobs", json=job_body(**changes)))
    assert pointer in errors and text in errors[pointer]["message"], errors
    _nothing_stored(api)
