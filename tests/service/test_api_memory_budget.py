"""Data-derived sizes are planned from the real data at submission (the memory limit of
docs/service.md#limits).

``:validate`` planned uploaded files with ``model.config`` defaults, so sizes taken from the
data were never checked: ``max(y) + 1 = 199,999`` classes trained (``num_classes`` of that
size in ``model.config`` is a 422), a crafted file's input width made a 4.3e9-parameter model
pass the 2e9 cap, and the memory bomb (a 437 KB NPZ declaring a Fortran-ordered
(25,000,000 x 4) float32 ``x``) was accepted. Each is now a 422 naming the dataset.
"""

from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest

from tests.engine.data.test_npy_fortran import write_zeros_npz
from tests.helpers.specs import early_stage, mlp_model, upload_dataset
from tests.service.api_helpers import Api, job_body

OCTET = {"content-type": "application/octet-stream"}


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def _upload(api: Api, data: bytes) -> str:
    api.client.app.state.settings = api.settings.model_copy(update={"max_upload_bytes": 2 << 20})
    resp = api.client.post("/v1/datasets?name=d&format=npz", content=data, headers=OCTET)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def _mlp_on(dataset_id: str, hidden: list[int]) -> dict:
    return job_body(
        model=mlp_model(*hidden),
        dataset=upload_dataset(dataset_id, "npz"),
        schedule=[early_stage(steps=2)],
    )


def _bomb() -> bytes:
    buf = io.BytesIO()
    write_zeros_npz(buf, 25_000_000, 4, compress=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "hidden", "words"),
    [
        (
            "classes",
            lambda: _npz(x=np.zeros((10, 4), np.float32), y=np.array([0] * 9 + [199_998])),
            [16],
            "num_classes = 199,999",
        ),
        (
            "too_wide",
            lambda: _npz(x=np.zeros((2, 1 << 20), np.float32), y=np.array([0, 1])),
            [4096],
            "dense parameters",
        ),
        ("bomb", _bomb, [16], "cannot be read by rows"),
    ],
)
def test_sizes_from_an_uploaded_file_are_checked_at_submission(
    api_lite: Api, name: str, data, hidden: list[int], words: str
):
    dataset_id = _upload(api_lite, data())
    for path in ("/v1/jobs:validate", "/v1/jobs"):
        start = time.perf_counter()
        resp = api_lite.client.post(path, json=_mlp_on(dataset_id, hidden))
        assert resp.status_code == 422, resp.text
        (error,) = resp.json()["errors"]
        assert error["pointer"] == "/dataset/dataset_id", error
        assert words in error["message"], error
        assert str(api_lite.settings.artifacts) not in error["message"]  # no server path
        assert time.perf_counter() - start < 30
    assert api_lite.client.get("/v1/jobs").json()["items"] == []


def test_the_plan_uses_the_files_real_sizes(api_lite: Api):
    dataset_id = _upload(api_lite, _npz(x=np.zeros((100, 3, 7), np.float32), y=np.arange(100) % 13))
    resp = api_lite.client.post("/v1/jobs:validate", json=_mlp_on(dataset_id, [32]))
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["params_before"] == (21 * 32 + 32) + (32 * 13 + 13)  # 21 features, 13 classes
    assert report["total_steps"] == 2
