"""``/v1/models``: a Hugging Face directory uploaded as one tar, checked before anything is kept
(pickles and code refused by name, config.json and the safetensors header as an ``hf`` job's),
size-limited, tenant-scoped; a job names it as ``model.source: {"kind": "uploaded"}``."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.hf_models import make_model_dir
from tests.service.api_helpers import Api, issue_key
from tests.service.test_api_hf_jobs import hf_body, hf_data_root

TAR = {"content-type": "application/x-tar"}


def tar_of(directory: Path, *, folder: str | None = "llama", extra: dict[str, bytes] | None = None):
    """The bytes of a tar of ``directory``'s files (under ``folder``), plus ``extra`` files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}
        for name, data in {**files, **(extra or {})}.items():
            info = tarfile.TarInfo(f"{folder}/{name}" if folder else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def upload(api: Api, body: bytes, name: str = "tiny-llama", headers: dict | None = None):
    return api.client.post(
        "/v1/models", params={"name": name}, content=body, headers=headers or TAR
    )


def _refused(resp, *words: str) -> str:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    for w in words:
        assert w in resp.text, (w, resp.text)
    return resp.text


def _nothing_kept(api: Api) -> None:
    folder = Path(api.settings.artifacts) / "models"
    assert [p.name for p in folder.iterdir()] == [] if folder.is_dir() else True
    assert api.client.get("/v1/models").json()["items"] == []


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "src", "llama")


def test_upload_list_get_and_delete(api: Api, llama: Path):
    resp = upload(api, tar_of(llama))
    assert resp.status_code == 201, resp.text
    model = resp.json()
    assert resp.headers["location"] == f"/v1/models/{model['id']}"
    assert model["model_type"] == "llama" and model["name"] == "tiny-llama"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(model["files"])
    weights = (llama / "model.safetensors").read_bytes()
    assert model["files"]["model.safetensors"]["size_bytes"] == len(weights)
    stored = Path(api.settings.artifacts) / "models" / model["id"] / "model.safetensors"
    assert stored.read_bytes() == weights
    flat = upload(api, tar_of(llama, folder=None), name="flat")  # files at the top level
    assert flat.status_code == 201, flat.text
    assert flat.json()["sha256"] == model["sha256"]  # the same files

    items = api.client.get("/v1/models", params={"limit": 1}).json()
    assert [m["id"] for m in items["items"]] == [flat.json()["id"]] and items["next_cursor"]
    assert api.client.get(f"/v1/models/{model['id']}").json() == model
    assert api.client.delete(f"/v1/models/{model['id']}").status_code == 204
    assert api.client.get(f"/v1/models/{model['id']}").status_code == 404
    assert not stored.parent.exists()
    assert api.client.delete(f"/v1/models/{model['id']}").status_code == 404
    assert upload(api, tar_of(llama), headers={"content-type": "text/plain"}).status_code == 415


def test_multipart_files_upload_the_same_directory(api: Api, llama: Path):
    def parts(extra: dict[str, bytes] | None = None) -> list:
        files = {p.name: p.read_bytes() for p in sorted(llama.iterdir())}
        return [("files", (n, d)) for n, d in {**files, **(extra or {})}.items()]

    post = api.client.post
    resp = post("/v1/models", params={"name": "parts"}, files=parts())
    assert resp.status_code == 201, resp.text
    assert resp.json()["sha256"] == upload(api, tar_of(llama)).json()["sha256"]
    _refused(post("/v1/models", params={"name": "x"}, files=parts({"evil.py": b"1"})), "evil.py")
    _refused(post("/v1/models", params={"name": "x"}, files=parts({"m.pkl": b"1"})), "m.pkl")
    resp = post("/v1/models", params={"name": "x"}, files=parts({"../up.json": b"{}"}))
    _refused(resp, "up.json")
    resp = post("/v1/models", params={"name": "x"}, files=parts(), data={"note": "hi"})
    _refused(resp, "multipart")
    assert len(api.client.get("/v1/models").json()["items"]) == 2


def test_pickles_code_links_and_traversal_are_refused_by_name(api: Api, llama: Path):
    _refused(
        upload(api, tar_of(llama, extra={"pytorch_model.bin": b"\x80\x04."})),
        "pytorch_model.bin",
        "pickled",
    )
    _refused(
        upload(api, tar_of(llama, extra={"modeling_evil.py": b"import os"})),
        "modeling_evil.py",
        "code",
    )
    _refused(upload(api, tar_of(llama, extra={"weights.pt": b"x"})), "weights.pt")
    _refused(upload(api, tar_of(llama, extra={"../escape.json": b"{}"})), "escape.json", "outside")
    _refused(upload(api, tar_of(llama, folder="/abs")), "/abs/", "outside")
    _refused(upload(api, tar_of(llama, folder="a/b")), "one folder")
    buf = io.BytesIO(tar_of(llama))
    with tarfile.open(fileobj=buf, mode="a") as tar:
        link = tarfile.TarInfo("llama/vocab.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    _refused(upload(api, buf.getvalue()), "vocab.txt", "symlink")
    _refused(upload(api, b"not a tar at all" * 100), "not a readable tar")
    _refused(upload(api, b"\x1f\x8b\x08\x00" + b"\xff" * 200), "not a readable tar")  # bad gzip
    _refused(upload(api, tar_of(llama, extra={"a b\u00e9.json": b"{}"})), "a file name of")
    _nothing_kept(api)


def _header(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _with_header(path: Path, header: dict[str, Any], data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_lying_safetensors_headers_and_huge_configs_are_refused(api: Api, llama: Path):
    header, data = _header(llama / "model.safetensors")
    name = next(k for k in header if k.endswith("embed_tokens.weight"))
    good = dict(header)

    offsets = {**good, name: {**good[name], "data_offsets": [0, 10**12]}}  # past the file
    _with_header(llama / "model.safetensors", offsets, data)
    _refused(upload(api, tar_of(llama)), "model.safetensors", "embed_tokens")
    shapes = {**good, name: {**good[name], "shape": [10**6, 10**6]}}  # 4 TB over its bytes
    _with_header(llama / "model.safetensors", shapes, data)
    _refused(upload(api, tar_of(llama)), "model.safetensors", "declares")
    _with_header(llama / "model.safetensors", good, data)

    config = json.loads((llama / "config.json").read_text())
    for field, value in (("num_hidden_layers", 10**9), ("vocab_size", 10**12)):
        (llama / "config.json").write_text(json.dumps({**config, field: value}))
        _refused(upload(api, tar_of(llama)), "config.json", field)
    (llama / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    _refused(upload(api, tar_of(llama)), "model_type")
    (llama / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))  # weights: 32
    _refused(upload(api, tar_of(llama)), "does not match config.json")
    (llama / "config.json").unlink()
    _refused(upload(api, tar_of(llama)), "config.json")
    _nothing_kept(api)


def test_the_size_limit_and_the_tenant_quota(api: Api, llama: Path):
    body = tar_of(llama)
    settings = api.client.app.state.settings
    api.client.app.state.settings = settings.model_copy(
        update={"max_model_upload_bytes": 64 * 1024}
    )
    try:
        resp = upload(api, body)
        assert resp.status_code == 413 and "exceeds" in resp.text, resp.text
        _nothing_kept(api)
        quota = len(body) + 1024  # room for one upload's files, not two
        api.client.app.state.settings = settings.model_copy(
            update={"max_model_bytes_per_tenant": quota}
        )
        assert upload(api, body).status_code == 201
        resp = upload(api, body)
        assert resp.status_code == 413 and "quota" in resp.text, resp.text
    finally:
        api.client.app.state.settings = settings
    assert not list((Path(api.settings.artifacts) / "models").glob(".*"))  # no temporary left


def test_another_tenant_neither_sees_nor_uses_a_model(api: Api, llama: Path):
    hf_data_root(Path(api.settings.data))
    model = upload(api, tar_of(llama)).json()
    other = {"Authorization": f"Bearer {issue_key(api.client.app, tenant='other')}"}
    assert api.client.get("/v1/models", headers=other).json()["items"] == []
    assert api.client.get(f"/v1/models/{model['id']}", headers=other).status_code == 404
    assert api.client.delete(f"/v1/models/{model['id']}", headers=other).status_code == 404
    body = hf_body(source={"kind": "uploaded", "id": model["id"]})
    resp = api.client.post("/v1/jobs", json=body, headers=other)
    assert resp.status_code == 422 and resp.json()["errors"][0]["pointer"] == "/model/source/id"
    # its own tenant plans it from the stored directory
    resp = api.client.post("/v1/jobs:validate", json=body)
    assert resp.status_code == 200, resp.text
    path = resp.json()["engine_config"]["model"]["config"]["path"]
    assert path == str((Path(api.settings.artifacts) / "models" / model["id"]).resolve())
    job = api.client.post("/v1/jobs", json=body)
    assert job.status_code == 202, job.text
    resp = api.client.delete(f"/v1/models/{model['id']}")
    assert resp.status_code == 409  # a job that has not finished uses it
