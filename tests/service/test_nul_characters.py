"""NUL (U+0000) in anything a client sends is a 422 naming where it is, on both stores.

PostgreSQL's text and jsonb cannot hold NUL: a label, a ``q`` or ``label`` filter, or a job id
holding one was a 500 there (``UntranslatableCharacter``) while SQLite accepted it. The rule
is kept once, at the edge (``service.nul_guard``); the sweeps below send a NUL in every string
of a full submission and in every query and path parameter the OpenAPI document declares.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from sqlalchemy import func, select

from service.store.db.models import Job
from tests.helpers.specs import hf_dir, model_spec, package, path_dataset, synthetic_dataset
from tests.service.api_helpers import Api, job_body, make_job

NUL = "\x00"


def _problem(resp) -> dict[str, Any]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    problem = resp.json()
    assert all(e["code"] == "nul_character" for e in problem["errors"]), problem
    return problem


def _pointers(resp) -> list[str]:
    return [e["pointer"] for e in _problem(resp)["errors"]]


def _parameters(resp) -> list[str]:
    return [e["parameter"] for e in _problem(resp)["errors"]]


def _jobs(api: Api) -> int:
    with api.sessions() as s:
        return s.scalar(select(func.count()).select_from(Job))


def test_nul_in_labels_is_a_422_on_submit_and_patch(api: Api):
    post = api.client.post
    assert _pointers(post("/v1/jobs", json=job_body(labels={"k": f"a{NUL}b"}))) == ["/labels/k"]
    assert _pointers(post("/v1/jobs:validate", json=job_body(labels={f"k{NUL}": "v"}))) == [
        "/labels"
    ]
    many = {f"k{i:02d}{'x' * 60}": "v" * 250 for i in range(31)}  # past 4 KiB: the child checks it
    resp = post("/v1/jobs", json=job_body(labels={**many, "last": f"{NUL}"}))
    assert len(resp.request.content) > 4096 and _pointers(resp) == ["/labels/last"]
    assert _jobs(api) == 0 and api.enqueued == []

    job_id = make_job(api, labels={"k": "v"})
    url = f"/v1/jobs/{job_id}"
    assert _pointers(api.client.patch(url, json={"labels": {"k": f"a{NUL}b"}})) == ["/labels/k"]
    assert _pointers(api.client.patch(url, json={"name": f"x{NUL}"})) == ["/name"]
    current = api.client.get(url)
    assert current.json()["labels"] == {"k": "v"}  # nothing changed
    # the same request without the NUL is accepted: the refusal is about NUL only
    etag = {"If-Match": current.headers["etag"]}
    assert api.client.patch(url, json={"labels": {"k": "ab"}}, headers=etag).status_code == 200


def test_nul_in_list_filters_and_ids_is_a_422_naming_the_parameter(api: Api):
    make_job(api, name="a", labels={"k": "ab"})
    get = api.client.get
    assert _parameters(get("/v1/jobs?q=a%00")) == ["q"]
    assert _parameters(get("/v1/jobs?label=k:a%00b")) == ["label"]
    assert _parameters(get("/v1/jobs?label=k:ab&label=k%00:x")) == ["label"]
    assert _parameters(get("/v1/jobs?state=QUEUED&model=m%00")) == ["model"]
    assert _parameters(get("/v1/jobs/job_1%00")) == ["path"]
    assert _parameters(get("/v1/jobs", params={"q": f"a{NUL}"})) == ["q"]
    # the same filters without NUL are answered by both stores alike
    assert [j["name"] for j in get("/v1/jobs?q=a&label=k:ab").json()["items"]] == ["a"]


# a submission with a string in every free-text field of the schema
FULL: dict[str, Any] = job_body(
    name="full job",
    labels={"team": "ml", "note": "free text"},
    model=model_spec("transformer", {"d_model": 32, "activation": "gelu"}),
    dataset=path_dataset(
        "data/train.jsonl",
        "jsonl",
        valid_path="data/valid.jsonl",
        text_a="premise",
        text_b="hypothesis",
        label_field="label",
        params={"style": "plain"},
    ),
    compression={"max_rank": 4, "layers": ["blocks.*"]},
)
HF = job_body(
    model=model_spec("hf_bert", source=hf_dir("models/tiny")),
    dataset=synthetic_dataset("stdlib_text", max_len=16),
)
PACKAGE = job_body(model=model_spec("hf_bert", source=package()))


def _strings(value: Any, parts: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every string value and every key of a JSON document."""
    if isinstance(value, str):
        return [parts]
    if isinstance(value, dict):
        return [(*parts, ("key", k)) for k in value] + [
            p for k, v in value.items() for p in _strings(v, (*parts, k))
        ]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _strings(v, (*parts, i))]
    return []


def _with_nul(body: dict[str, Any], path: tuple[Any, ...]) -> tuple[dict[str, Any], str]:
    """``body`` with a NUL in the string at ``path``, and the pointer that must be named."""
    out = copy.deepcopy(body)
    parent: Any = out
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if isinstance(last, tuple):  # a key: renamed, the pointer names its object
        parent[f"{last[1]}{NUL}"] = parent.pop(last[1])
        return out, "".join(f"/{p}" for p in path[:-1])
    parent[last] = f"{parent[last][:1]}{NUL}{parent[last][1:]}"
    return out, "".join(f"/{p}" for p in path)


@pytest.mark.parametrize("body", [FULL, HF, PACKAGE], ids=["full", "hf_dir", "package"])
def test_nul_in_any_string_of_a_body_is_a_422_naming_it(api: Api, body: dict[str, Any]):
    paths = _strings(body)
    assert len(paths) >= 20
    for path in paths:
        bad, pointer = _with_nul(body, path)
        for url in ("/v1/jobs", "/v1/jobs:validate"):
            assert _pointers(api.client.post(url, json=bad)) == [pointer], (url, path)
    job_id = make_job(api)
    for action, field in (("cancel", "mode"), ("retry", "from")):
        resp = api.client.post(f"/v1/jobs/{job_id}/{action}", json={field: f"x{NUL}"})
        assert _pointers(resp) == [f"/{field}"], action
    assert _jobs(api) == 1 and api.enqueued == []


def test_nul_in_every_query_and_path_parameter_is_a_422(api: Api):
    """Every route and parameter of the OpenAPI document, before it reaches a handler."""
    job_id = make_job(api)
    spec = api.client.get("/openapi.json").json()
    seen = 0

    def named(method: str, url: str) -> list[str]:
        resp = api.client.request(method, url)
        if method == "head":  # no body: the status says it
            assert resp.status_code == 422, url
            return [url.partition("?")[2].partition("=")[0] or "path"]
        return _parameters(resp)

    for template, methods in spec["paths"].items():
        for method, op in methods.items():
            params = op.get("parameters", [])
            path = re.sub(r"\{job_id\}", job_id, template)
            for p in params:
                if p["in"] == "query":
                    url = re.sub(r"\{[^}]+\}", "x", path)
                    got = named(method, f"{url}?{p['name']}=a%00b")
                    assert got == [p["name"]], (method, template, p["name"])
                    seen += 1
                elif p["in"] == "path":
                    url = re.sub(r"\{" + p["name"] + r"\}", "a%00b", template)
                    url = re.sub(r"\{[^}]+\}", "x", url)
                    assert named(method, url) == ["path"], (method, template, p["name"])
                    seen += 1
    assert seen >= 20  # q, label, stage, tensor, dataset names, ids, cursors, ...
    assert _parameters(api.client.get("/v1/jobs", headers={"If-None-Match": "a\x00b"})) == [
        "if-none-match"
    ]
