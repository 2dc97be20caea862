"""A worker's ``host:pid`` is the server's business: it stays out of what tenants read (job
events, the attempts of ordinary keys) and is shown to admin keys only. The reaper's own
messages are checked in ``test_reaper``."""

from __future__ import annotations

import json
import socket

from sqlalchemy import select, update

from service.store.auth import DEFAULT_SCOPES
from service.store.db.models import JobAttempt, JobEvent
from service.store.db.session import session_scope
from tests.service.api_helpers import Api, issue_key, make_job
from tests.worker.jobs import factory_for, tiny_spec
from tests.worker.jobs import make_job as make_worker_job
from worker.lease import Heartbeat
from worker.pipeline import claim

OWNER = f"{socket.gethostname()}:4242"


def test_claim_and_heartbeat_events_do_not_name_the_worker(sqlite_url):
    factory = factory_for(sqlite_url)
    job_id = make_worker_job(factory, tiny_spec())
    assert claim(factory, job_id=job_id, attempt=1, owner=OWNER, lease_seconds=30.0)
    beat = Heartbeat(
        factory=factory,
        job_id=job_id,
        attempt=1,
        owner=OWNER,
        lease_seconds=30.0,
        interval=1.0,
        status=lambda: {"step": 3, "stage": "early"},
    )
    assert beat.beat()
    with session_scope(factory) as s:
        events = s.execute(
            select(JobEvent.kind, JobEvent.data).where(JobEvent.job_id == job_id)
        ).all()
    assert {kind for kind, _ in events} == {"state", "heartbeat"}
    assert OWNER not in json.dumps([data for _, data in events])
    assert socket.gethostname() not in json.dumps([data for _, data in events])
    [heartbeat] = [data for kind, data in events if kind == "heartbeat"]
    assert heartbeat == {"step": 3, "stage": "early"}


def test_attempts_name_the_worker_to_admin_keys_only(api_lite: Api):
    job_id = make_job(api_lite, state="RUNNING")
    with api_lite.sessions() as s, s.begin():
        s.execute(update(JobAttempt).where(JobAttempt.job_id == job_id).values(worker=OWNER))
    url = f"/v1/jobs/{job_id}/attempts"
    [admin] = api_lite.client.get(url).json()["items"]  # the fixture's key has every scope
    assert admin["worker"] == OWNER
    tenant_key = issue_key(api_lite.client.app, scopes=DEFAULT_SCOPES)  # no admin
    [seen] = api_lite.client.get(url, headers={"Authorization": f"Bearer {tenant_key}"}).json()[
        "items"
    ]
    assert seen["worker"] is None and seen["attempt"] == 1
