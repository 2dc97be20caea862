"""The queued-jobs quota holds under concurrent submissions: the count and the insert run one
request at a time per tenant (a row lock on PostgreSQL, a process lock on SQLite), so N
threads submitting at once against a quota of Q queue exactly Q jobs and get 429 for the rest,
on both backends. The tenant's queued wall time has its cap too (429 naming the setting)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import HTTPException

from api_schemas import JobCreate, JobState
from service.store.db.crud.job_queries import count_jobs
from service.submission import submit
from tests.service.api_helpers import Api, job_body

QUOTA, THREADS = 3, 8


def test_concurrent_submissions_never_exceed_the_queued_quota(api: Api):
    settings = api.settings.model_copy(update={"max_queued_jobs_per_tenant": QUOTA})
    tenant, spec = api.tenant_id(), JobCreate.model_validate(job_body())
    start = threading.Barrier(THREADS)
    outcomes: list[Any] = []

    def one() -> None:
        with api.sessions() as session:
            start.wait()
            try:
                job = submit(
                    session=session,
                    settings=settings,
                    tenant_id=tenant,
                    spec=spec,
                    engine_job={},
                    enqueue=lambda **kw: True,
                )
                outcomes.append(job.id)
            except HTTPException as err:
                outcomes.append(err.status_code)

    threads = [threading.Thread(target=one) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == THREADS
    assert sorted(o for o in outcomes if isinstance(o, int)) == [429] * (THREADS - QUOTA)
    with api.sessions() as s:
        assert count_jobs(session=s, tenant_id=tenant, states=[JobState.QUEUED]) == QUOTA


def test_queued_wall_time_past_the_tenant_cap_is_429_naming_the_limit(api: Api):
    app = api.client.app
    app.state.settings = api.settings.model_copy(
        update={"max_queued_wall_seconds_per_tenant": 1000}
    )
    ten_min = job_body(limits={"max_wall_time_s": 600})
    assert api.client.post("/v1/jobs", json=ten_min).status_code == 202
    resp = api.client.post("/v1/jobs", json=ten_min)  # 1200 s queued would pass 1000 s
    assert resp.status_code == 429 and resp.headers["retry-after"] == "60", resp.text
    problem = resp.json()
    assert "COMERA_MAX_QUEUED_WALL_SECONDS_PER_TENANT (1000 s)" in problem["detail"]
    assert [e["pointer"] for e in problem["errors"]] == ["/limits/max_wall_time_s"]
    assert api.client.post("/v1/jobs", json=job_body(limits={"max_wall_time_s": 400})).is_success
    with api.sessions() as s:  # what is queued stays at the cap
        assert count_jobs(session=s, tenant_id=api.tenant_id(), states=[JobState.QUEUED]) == 2
