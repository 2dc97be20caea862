"""Dataset uploads: streamed, hashed, size-limited, format-checked; then usable by jobs."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.specs import mlp_model, upload_dataset
from tests.service.api_helpers import Api, job_body

OCTET = {"content-type": "application/octet-stream"}
CRITEO_OK = "\t".join(["1", *["3", "", "-2"] * 4, "7", *["a1b2", "", "FFFF0000"] * 8, "0", "c"])


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


GOOD = {
    "jsonl": (b'{"premise": "a", "hypothesis": "b", "label": "x"}\n\n{"premise": "c"}\n', 2),
    "csv": (b'premise,hypothesis,label\na,b,x\n"c, d",e,y\n', 2),
    "criteo": ((CRITEO_OK + "\n" + CRITEO_OK + "\n").encode(), 2),
    "text": ("first line\nzweite Zeile \u00e9\nno newline at end".encode(), 3),
    "npz": (_npz(x=np.zeros((5, 2, 3), np.float32), y=np.arange(5)), 5),
}
BAD = {
    "jsonl": [
        (b'{"a": 1}\n[1, 2]\n', "line 2: expected a JSON object"),
        (b'{"a": 1}\n{"a": \n', "line 2: not valid JSON"),
    ],
    "csv": [
        (b"a,b\n1,2\n1,2,3\n", "line 3: 3 columns"),
        (b"a,b\n\xff,1\n", "not UTF-8"),
        (b"a,b\n", "no csv rows"),
    ],
    "criteo": [
        (CRITEO_OK.rsplit("\t", 1)[0].encode(), "expected 40 tab-separated fields"),
        (("2" + CRITEO_OK[1:]).encode(), "expected label 0 or 1"),
        (CRITEO_OK.replace("a1b2", "xyz", 1).encode(), "hex string"),
    ],
    "text": [(b"ok\n\xff\xfe\n", "not UTF-8"), (b"\n \n", "no text rows")],
    "npz": [
        (b"not a zip", "not an .npz"),
        (_npz(x=np.array([{"a": 1}, None], dtype=object), y=np.arange(2)), "pickles"),
        (_npz(x=np.zeros((3, 2)), y=np.zeros(3)), "integer labels"),
        (_npz(a=np.zeros(3)), "expected arrays 'x' and 'y'"),
    ],
}


def _files(api: Api) -> list[Path]:
    folder = Path(api.settings.artifacts) / "datasets"
    return sorted(folder.iterdir()) if folder.exists() else []


def _upload(api: Api, data: bytes | object, fmt: str, name: str = "d1", headers=OCTET):
    return api.client.post(f"/v1/datasets?name={name}&format={fmt}", content=data, headers=headers)


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_upload_each_format(api_lite: Api, fmt: str):
    data, rows = GOOD[fmt]
    resp = _upload(api_lite, data, fmt)
    assert resp.status_code == 201, resp.text
    ds = resp.json()
    assert ds["format"] == fmt and ds["rows"] == rows and ds["state"] == "ready"
    assert ds["size_bytes"] == len(data) and ds["sha256"] == hashlib.sha256(data).hexdigest()
    assert resp.headers["location"] == f"/v1/datasets/{ds['id']}"
    (path,) = _files(api_lite)
    assert path.name == ds["id"] and path.read_bytes() == data
    assert api_lite.client.get(f"/v1/datasets/{ds['id']}").json() == ds


@pytest.mark.parametrize(
    "fmt, data, reason", [(f, d, r) for f, cases in BAD.items() for d, r in cases]
)
def test_malformed_upload_is_422_and_nothing_is_kept(
    api_lite: Api, fmt: str, data: bytes, reason: str
):
    resp = _upload(api_lite, data, fmt)
    assert resp.status_code == 422, resp.text
    assert reason in resp.json()["detail"] and resp.json()["errors"][0]["code"] == "format"
    assert _files(api_lite) == []
    assert api_lite.client.get("/v1/datasets").json()["items"] == []


def test_too_large_is_413_declared_or_streamed_and_nothing_is_kept(api_lite: Api):
    limit = api_lite.settings.max_upload_bytes
    assert _upload(api_lite, b"a\n" * (limit // 2) + b"x", "text").status_code == 413

    def chunks():  # no Content-Length: counted while streaming
        for _ in range(limit // 4096 + 2):
            yield b"b" * 4095 + b"\n"

    resp = _upload(api_lite, chunks(), "text")
    assert resp.status_code == 413 and resp.headers["content-type"].startswith(
        "application/problem+json"
    )
    assert _files(api_lite) == []
    assert limit > api_lite.settings.max_body_bytes
    at_limit = _upload(api_lite, b"c" * (limit - 1) + b"\n", "text")
    assert at_limit.status_code == 201  # uploads are exempt from the request body limit


def test_upload_needs_octet_stream_and_valid_parameters(api_lite: Api):
    assert (
        _upload(api_lite, b"x\n", "text", headers={"content-type": "text/plain"}).status_code == 415
    )
    bad = _upload(api_lite, b"x\n", "parquet")
    assert bad.status_code == 422 and bad.json()["errors"][0]["parameter"] == "format"


def test_jobs_use_uploads_and_deletion_waits_for_them(api: Api):
    data, _ = GOOD["npz"]
    ds = _upload(api, data, "npz").json()
    mismatch = job_body(dataset={"source": "upload", "dataset_id": ds["id"], "format": "text"})
    resp = api.client.post("/v1/jobs", json=mismatch)
    assert resp.status_code == 422 and resp.json()["errors"][0]["pointer"] == "/dataset/format"
    body = job_body(
        dataset=upload_dataset(ds["id"], "npz"),
        model=mlp_model(64, 64, in_features=6, num_classes=5),
    )
    job = api.client.post("/v1/jobs", json=body)
    assert job.status_code == 202, job.text
    assert api.client.delete(f"/v1/datasets/{ds['id']}").status_code == 409
    api.client.post(f"/v1/jobs/{job.json()['id']}/cancel")
    assert api.client.delete(f"/v1/datasets/{ds['id']}").status_code == 204
    assert _files(api) == [] and api.client.get(f"/v1/datasets/{ds['id']}").status_code == 404


def test_dataset_list_pages(api: Api):
    ids = [_upload(api, b"line\n", "text", name=f"d{i}").json()["id"] for i in range(5)]
    page = api.client.get("/v1/datasets?limit=3").json()
    rest = api.client.get(f"/v1/datasets?limit=3&cursor={page['next_cursor']}").json()
    assert [d["id"] for d in page["items"] + rest["items"]] == ids[::-1]
    assert rest["next_cursor"] is None
    assert api.client.get("/v1/datasets?cursor=%%%").status_code == 400


def test_npz_with_a_member_that_is_not_an_array_is_refused(api_lite: Api):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x.npy", b"")
        zf.writestr("payload.pkl", b"\x80\x04K\x01.")
    resp = _upload(api_lite, buf.getvalue(), "npz")
    assert resp.status_code == 422 and "payload.pkl" in resp.json()["detail"]
    assert _files(api_lite) == []
