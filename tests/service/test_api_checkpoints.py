"""Checkpoint downloads (full, ranges, If-Range, digests), manifests and the report."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from tests.helpers.specs import model_spec
from tests.service.api_helpers import BLOB, Api, job_body, make_job
from tests.service.api_helpers import add_checkpoint as _add
from tests.service.api_helpers import write_artifact as _file


def test_full_download_with_etag_and_repr_digest(ckpt):
    api, url = ckpt
    resp = api.client.get(url)
    assert resp.status_code == 200 and resp.content == BLOB
    digest = hashlib.sha256(resp.content).digest()
    assert resp.headers["etag"] == f'"sha256:{digest.hex()}"'
    assert resp.headers["repr-digest"] == f"sha-256=:{base64.b64encode(digest).decode()}:"
    assert resp.headers["accept-ranges"] == "bytes"
    assert resp.headers["content-length"] == str(len(BLOB))
    assert resp.headers["content-disposition"] == 'attachment; filename="ckpt_a.safetensors"'
    head = api.client.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(BLOB))
    assert head.headers["etag"] == resp.headers["etag"]


@pytest.mark.parametrize(
    "header, start, end",
    [
        ("bytes=0-99", 0, 99),
        ("bytes=100-", 100, len(BLOB) - 1),
        ("bytes=-10", len(BLOB) - 10, len(BLOB) - 1),
        ("bytes=4990-999999", 4990, len(BLOB) - 1),
        ("bytes=-99999", 0, len(BLOB) - 1),
    ],
)
def test_single_ranges_give_206(ckpt, header: str, start: int, end: int):
    api, url = ckpt
    resp = api.client.get(url, headers={"Range": header})
    assert resp.status_code == 206 and resp.content == BLOB[start : end + 1]
    assert resp.headers["content-range"] == f"bytes {start}-{end}/{len(BLOB)}"
    assert resp.headers["content-length"] == str(end - start + 1)
    whole = base64.b64encode(hashlib.sha256(BLOB).digest()).decode()
    assert resp.headers["repr-digest"] == f"sha-256=:{whole}:"  # of the whole file


def test_unsatisfiable_ignored_and_if_range(ckpt):
    api, url = ckpt
    for header in (f"bytes={len(BLOB)}-", "bytes=-0"):
        resp = api.client.get(url, headers={"Range": header})
        assert resp.status_code == 416 and resp.headers["content-range"] == f"bytes */{len(BLOB)}"
    for header in ("bytes=5-2", "items=0-3", "bytes=0-1,5-6"):  # ignored: the whole file
        assert api.client.get(url, headers={"Range": header}).status_code == 200
    etag = api.client.head(url).headers["etag"]
    same = api.client.get(url, headers={"Range": "bytes=0-9", "If-Range": etag})
    assert same.status_code == 206 and same.content == BLOB[:10]
    stale = api.client.get(url, headers={"Range": "bytes=0-9", "If-Range": '"sha256:00"'})
    assert stale.status_code == 200 and stale.content == BLOB


def test_writing_deleted_missing_and_unknown(api_lite: Api):
    api = api_lite
    job_id = make_job(api, state="RUNNING")
    base = f"/v1/jobs/{job_id}/checkpoints"
    _add(api, job_id, "ckpt_w", "jobs/w.bin", state="writing")
    _add(api, job_id, "ckpt_d", "jobs/d.bin", state="deleted")
    _add(api, job_id, "ckpt_m", "jobs/missing.bin")
    _add(api, job_id, "ckpt_esc", "../outside.bin")
    assert api.client.get(f"{base}/ckpt_w/content").status_code == 409
    assert api.client.get(f"{base}/ckpt_d/content").status_code == 410
    assert api.client.get(f"{base}/ckpt_m/content").status_code == 410
    assert api.client.get(f"{base}/ckpt_esc/content").status_code == 410
    assert api.client.get(f"{base}/ckpt_zz/content").status_code == 404
    other = make_job(api)
    assert api.client.get(f"/v1/jobs/{other}/checkpoints/ckpt_w/content").status_code == 404
    listed = api.client.get(base).json()["items"]
    assert [(c["id"], c["state"]) for c in listed] == [
        ("ckpt_w", "writing"),
        ("ckpt_d", "deleted"),
        ("ckpt_m", "complete"),
        ("ckpt_esc", "complete"),
    ]
    assert listed[0]["links"]["content"] == f"{base}/ckpt_w/content"


def _manifest(blob: bytes, params: int = 400, dense: int = 4000) -> dict:
    return {
        "format": "comera-compressed",
        "format_version": 1,
        "engine_version": "0.1.0",
        "arch": "mlp",
        "layers": [
            {
                "name": "hidden.0",
                "kind": "tt_linear",
                "in_modes": [4, 4],
                "out_modes": [8, 8],
                "ranks": [1, 3, 1],
                "params": params,
                "dense_params": dense,
                "ratio": dense / params,
            },
            {
                "name": "emb",
                "kind": "ttm_embedding",
                "row_modes": [10, 10],
                "col_modes": [2, 2],
                "ranks": [1, 0, 1],
                "params": 0,
                "dense_params": 400,
                "ratio": None,
            },
        ],
        "totals": {
            "stored_params": 1000,
            "dense_equivalent_params": 5000,
            "tensorized_ratio": 11.0,
            "model_ratio": 5.0,
        },
        "weights": {
            "file": "model.safetensors",
            "bytes": len(blob),
            "dense_equivalent_bytes": 20000,
            "sha256": hashlib.sha256(blob).hexdigest(),
        },
        "metrics": {"accuracy": 0.9},
        "extra": {},
    }


def test_report_is_measured_on_the_export_and_names_a_dense_baseline(api: Api):
    job_id = make_job(api, state="RUNNING")
    assert api.client.get(f"/v1/jobs/{job_id}/report").status_code == 409
    folder = f"jobs/{job_id}/export"
    _file(api, f"{folder}/model.safetensors")
    _file(api, f"{folder}/manifest.json", json.dumps(_manifest(BLOB)).encode())
    _add(api, job_id, "ckpt_x", folder, kind="export", manifest=_manifest(BLOB))
    # the dense twin: same model, data, training and total steps (10), with its own export
    dense_body = job_body(
        compression={"method": "dense"}, schedule=[{"kind": "early", "steps": 10}]
    )
    base = make_job(api, state="SUCCEEDED", body=dense_body)
    other = make_job(api, state="SUCCEEDED", body={**dense_body, "model": model_spec("mlp")})
    for dense_job, accuracy in ((base, 0.93), (other, 0.5)):
        dense_manifest = {**_manifest(BLOB), "metrics": {"accuracy": accuracy}}
        _add(
            api,
            dense_job,
            f"ckpt_{dense_job[-6:]}",
            f"jobs/{dense_job}/export",
            kind="export",
            manifest=dense_manifest,
        )
    resp = api.client.get(f"/v1/jobs/{job_id}/report")
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["checkpoint_id"] == "ckpt_x" and report["file_bytes"] == len(BLOB)
    assert report["dense_bytes"] == 20000 and report["file_ratio"] == 20000 / len(BLOB)
    assert report["params"] == 1000 and report["params_dense"] == 5000
    assert report["layers"][0]["modes"] == {"in": [4, 4], "out": [8, 8]}
    assert report["layers"][0]["ratio"] == 10.0 and report["layers"][1]["ratio"] is None
    assert report["metrics"] == {"accuracy": 0.9}
    assert report["baseline"]["job_id"] == base
    assert report["baseline"]["metrics"] == {"accuracy": 0.93}
    assert report["baseline"]["deltas"] == {"accuracy": 0.9 - 0.93}
    manifest = api.client.get(f"/v1/jobs/{job_id}/checkpoints/ckpt_x/manifest").json()
    files = {f["name"]: f for f in manifest["files"]}
    assert files["model.safetensors"]["sha256"] == hashlib.sha256(BLOB).hexdigest()
    on_disk = (Path(api.settings.artifacts) / folder / "manifest.json").read_bytes()
    assert files["manifest.json"]["sha256"] == hashlib.sha256(on_disk).hexdigest()
    assert manifest["manifest"]["totals"]["model_ratio"] == 5.0
    content = api.client.get(f"/v1/jobs/{job_id}/checkpoints/ckpt_x/content")
    assert content.content == BLOB  # a directory checkpoint serves its weights file
