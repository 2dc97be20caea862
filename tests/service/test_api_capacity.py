"""A placement no worker can run (``service.store.workers``, ``service.capacity``): a 422 naming
the field once workers have registered, ``waiting_for_capacity`` while none has."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.store.db.models import utcnow
from service.store.settings import Settings
from service.store.workers import WAITING, register_worker, served_queues
from tests.helpers.services import wait_for
from tests.service.api_helpers import Api, job_body
from tests.worker.test_celery import celery_worker

pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)


def _post(api: Api, **training):
    return api.client.post("/v1/jobs", json=job_body(training={"batch_size": 64, **training}))


def _pointer(resp) -> str:
    assert resp.status_code == 422, resp.text
    [error] = resp.json()["errors"]
    assert error["code"] == "no_capacity", error
    return error["pointer"]


def _register(api: Api, name: str, *queues: str, seen_ago: float = 0.0) -> int:
    with api.sessions() as session:
        now = utcnow() - timedelta(seconds=seen_ago)
        return register_worker(
            session=session, settings=api.settings, name=name, queues=list(queues), now=now
        )


def test_a_real_one_device_worker_registers_and_a_64_device_job_is_a_422(api_lite: Api, tmp_path):
    settings = Settings(home=tmp_path / "worker", database_url=api_lite.settings.db_url)
    settings.ensure_dirs()
    log = tmp_path / "worker.log"
    with celery_worker(settings, log):

        def registered() -> set[str]:
            with api_lite.sessions() as session:
                return served_queues(session=session, settings=api_lite.settings)

        assert wait_for(registered, 60, "the worker's row", log.read_text) == {"gpu.any"}
        resp = _post(api_lite, devices=64)
        assert _pointer(resp) == "/training/devices"
        assert "training.devices 64" in resp.text and "gpu.any.x64" in resp.text
        assert "comera worker --devices 64" in resp.text
        assert _pointer(_post(api_lite, nodes=2)) == "/training/nodes"
        dry = api_lite.client.post(
            "/v1/jobs:validate", json=job_body(training={"batch_size": 64, "devices": 64})
        )
        assert _pointer(dry) == "/training/devices"
        assert api_lite.enqueued == []  # nothing was stored or sent
        ok = _post(api_lite)
        assert ok.status_code == 202, ok.text
        assert ok.json()["message"] == "queued"


def test_with_no_worker_registered_a_job_waits_for_capacity_until_one_registers(api_lite: Api):
    resp = _post(api_lite, devices=2)
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["state"] == "QUEUED" and job["message"].startswith(f"{WAITING}: ")
    assert "no worker has reported" in job["message"] and "gpu.any.x2" in job["message"]
    assert "comera worker --devices 2" in job["message"]
    one = _post(api_lite).json()  # a 1-device job waits too
    assert one["message"].startswith(WAITING)

    assert _register(api_lite, "gpu0@a", "gpu.any", "comera.maintenance") == 1
    read = lambda job_id: api_lite.client.get(f"/v1/jobs/{job_id}").json()  # noqa: E731
    assert read(one["id"])["message"] == "queued"
    assert read(job["id"])["message"].startswith(WAITING)  # a 1-device worker cannot run it
    assert _pointer(_post(api_lite, devices=2)) == "/training/devices"  # now workers count

    assert _register(api_lite, "gpus2@b", "gpu.any.x2") == 1
    assert read(job["id"])["message"] == "queued"
    assert _post(api_lite, devices=2).json()["message"] == "queued"


def test_a_worker_not_seen_within_the_ttl_no_longer_counts(api_lite: Api):
    ttl = api_lite.settings.worker_ttl_seconds
    _register(api_lite, "gpus4@old", "gpu.any.x4", seen_ago=ttl + 1)
    assert _post(api_lite, devices=4).json()["message"].startswith(WAITING)
    _register(api_lite, "gpu0@a", "gpu.any")
    assert _pointer(_post(api_lite, devices=4)) == "/training/devices"
    _register(api_lite, "gpus4@old", "gpu.any.x4")  # it comes back
    assert _post(api_lite, devices=4).status_code == 202
