"""Fixtures of the HTTP API tests (``api`` and ``api_lite`` are suite-wide, in
``tests/conftest.py``)."""

from __future__ import annotations

import hashlib

import pytest

from tests.service.api_helpers import BLOB, Api, add_checkpoint, make_job, write_artifact


@pytest.fixture
def ckpt(api: Api) -> tuple[Api, str]:
    """A RUNNING job with one complete checkpoint of ``BLOB``: the API and its content URL."""
    job_id = make_job(api, state="RUNNING")
    rel = f"jobs/{job_id}/ckpt_a.safetensors"
    write_artifact(api, rel)
    add_checkpoint(api, job_id, "ckpt_a", rel, sha=hashlib.sha256(BLOB).hexdigest())
    return api, f"/v1/jobs/{job_id}/checkpoints/ckpt_a/content"
