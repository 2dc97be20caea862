"""Where a submitted job goes: the queue of its placement (``service.store.placement``)."""

from __future__ import annotations

from tests.service.api_helpers import Api, job_body


def test_a_two_device_job_is_sent_for_two_devices(api: Api):
    body = job_body(training={"batch_size": 32, "devices": 2})
    resp = api.client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.text
    [sent] = api.enqueued
    assert (sent["devices"], sent["nodes"]) == (2, 1)
    assert resp.json()["spec"]["training"]["devices"] == 2
