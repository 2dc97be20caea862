"""Hostile requests are 4xx problems naming the field, never a 500
(docs/input-limits.md#headers-and-paths): paths
the file system refuses, deeply nested model files, positions and lengths of any number of
digits."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from service.downloads import BEYOND, ByteRange, Unsatisfiable, parse_range
from service.middleware import BodyLimitMiddleware, content_length_exceeds
from tests.helpers.hf_dirs import write_bert_dir
from tests.helpers.hostile_files import nested_json
from tests.helpers.specs import hf_dir, mlp_model, model_spec, synthetic_dataset
from tests.service.api_helpers import BLOB, Api, job_body

LONG = "a" * 300  # one component past NAME_MAX (255): ENAMETOOLONG


def _problem(resp, status: int = 422) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return resp.json()


@pytest.mark.parametrize("path", [LONG, f"data/{LONG}/train.npz"], ids=["file", "dir"])
@pytest.mark.parametrize("field", ["path", "valid_path"])
def test_a_data_path_the_file_system_refuses_is_a_422_naming_it(api_lite: Api, field, path):
    (Path(api_lite.settings.data) / "data").mkdir(parents=True)
    (Path(api_lite.settings.data) / "train.npz").write_bytes(b"x")
    dataset = {"source": "path", "format": "npz", "path": "train.npz", field: path}
    body = job_body(model=mlp_model(8), dataset=dataset)
    for url in ("/v1/jobs", "/v1/jobs:validate"):
        problem = _problem(api_lite.client.post(url, json=body))
        assert [e["pointer"] for e in problem["errors"]] == [f"/dataset/{field}"]


def test_a_symlink_loop_is_a_422_naming_the_field(api: Api):
    """``ln -s loop loop``: ``Path.resolve()`` raises RuntimeError on Python 3.11 (a 500)."""
    root = Path(api.settings.data)
    write_bert_dir(root / "models" / "tiny")
    for link in ("loop", "models/loop", "models/tiny/config.json"):
        (root / link).unlink(missing_ok=True)
        (root / link).symlink_to(Path(link).name)
    (root / "train.npz").write_bytes(b"x")
    cases = [
        (_npz_body(path="loop"), "/dataset/path"),
        (_npz_body(path="loop/train.npz"), "/dataset/path"),
        (_npz_body(path="train.npz", valid_path="loop"), "/dataset/valid_path"),
        (_hf_body("models/loop"), "/model/source/path"),
        (_hf_body("models/tiny"), "/model/source/path"),  # its config.json loops
    ]
    for body, pointer in cases:
        for url in ("/v1/jobs", "/v1/jobs:validate"):
            problem = _problem(api.client.post(url, json=body))
            (error,) = problem["errors"]
            assert error["pointer"] == pointer and "symlink loop" in error["message"], problem
            assert str(root) not in json.dumps(problem) and "/tmp" not in json.dumps(problem)


def _npz_body(**dataset: str) -> dict[str, Any]:
    return job_body(
        model=mlp_model(8),
        dataset={"source": "path", "format": "npz", **dataset},
    )


def _hf_body(path: str) -> dict[str, Any]:
    return job_body(
        model=model_spec("hf_bert", source=hf_dir(path)),
        dataset=synthetic_dataset("stdlib_text", max_len=16),
    )


def _nested_header(directory: Path) -> None:
    """``model.safetensors`` whose (well-sized) JSON header nests 2,000 levels deep."""
    header = nested_json(2000).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.mark.parametrize("broken", ["config.json", "model.safetensors"])
def test_deeply_nested_model_files_are_a_422_naming_the_source(api_lite: Api, broken: str):
    directory = write_bert_dir(Path(api_lite.settings.data) / "models" / "deep")
    if broken == "config.json":  # RecursionError in json.loads: was a 500
        (directory / "config.json").write_text(nested_json(2000))
    else:
        _nested_header(directory)
    for url in ("/v1/jobs", "/v1/jobs:validate"):
        problem = _problem(api_lite.client.post(url, json=_hf_body("models/deep")))
        (error,) = problem["errors"]
        assert error["pointer"] == "/model/source/path"
        assert broken in error["message"] and "deeper than 64 levels" in error["message"]


def test_ranges_of_any_number_of_digits(ckpt):
    huge = "9" * 5000  # past Python's int-digit limit: int() raised, a 500
    for header in (f"bytes={huge}-", f"bytes={huge}-{huge}"):
        with pytest.raises(Unsatisfiable):
            parse_range(header, 100)
    assert parse_range(f"bytes=0-{huge}", 100) == ByteRange(0, 99)
    assert parse_range(f"bytes=-{huge}", 100) == ByteRange(0, 99)
    assert parse_range(f"bytes=10-{'0' * 5000}20", 100) == ByteRange(10, 20)
    assert BEYOND > 2**63
    api, url = ckpt
    resp = api.client.get(url, headers={"Range": f"bytes={huge}-"})
    assert _problem(resp, 416) and resp.headers["content-range"] == f"bytes */{len(BLOB)}"
    resp = api.client.get(url, headers={"Range": f"bytes=-{huge}"})
    assert resp.status_code == 206 and resp.content == BLOB
    resp = api.client.get(url, headers={"Range": f"bytes=5-{huge}"})
    assert resp.status_code == 206 and resp.content == BLOB[5:]


async def _call(app, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": "POST", "path": "/v1/jobs", "headers": headers}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_content_length_of_any_number_of_digits():
    async def ok(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = BodyLimitMiddleware(ok, max_bytes=1024)
    sent = asyncio.run(_call(app, [(b"content-length", b"9" * 5000)]))  # int() raised: a 500
    assert sent[0]["status"] == 413 and json.loads(sent[1]["body"])["status"] == 413
    assert asyncio.run(_call(app, [(b"content-length", b"0" * 5000 + b"12")]))[0]["status"] == 200
    # the upload route reads the header as text: a latin-1 superscript two passes
    # str.isdigit() but not int(); it is no number of bytes, so no limit applies to it
    assert content_length_exceeds("9" * 5000, 1024) and not content_length_exceeds("\u00b2", 1)
