"""Many more requests in flight than database connections: every one is answered.

Without admission control the handler threads wait for connections held by requests that
wait for threads (FastAPI hops through the pool for the handler and again for response
validation), and the pool times out with 500s. Real PostgreSQL, a real app, 60 concurrent
requests against a pool of 2 connections and 2 threads.
"""

from __future__ import annotations

import asyncio

import httpx

from service.main import create_app
from service.store.settings import Settings
from tests.service.api_helpers import issue_key, job_body


def test_sixty_concurrent_requests_through_a_two_connection_pool(pg_url, tmp_path):
    settings = Settings(
        home=tmp_path / "home",
        database_url=pg_url,
        broker_url="memory://",
        api_threads=2,
        db_pool_size=1,
        db_max_overflow=1,
    )
    app = create_app(settings)
    app.state.planner = None  # not needed: only reads below

    async def run() -> list[int]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            auth = {"Authorization": f"Bearer {issue_key(app)}"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://t", headers=auth
            ) as client:
                from service.store.db.crud.jobs import create_job
                from service.store.db.crud.tenants import get_or_create_tenant

                with app.state.sessionmaker() as s:
                    tenant = get_or_create_tenant(session=s, name="default")
                    job = create_job(
                        session=s,
                        tenant_id=tenant.id,
                        name="j",
                        labels={},
                        spec=job_body(),
                        spec_hash="h",
                        max_attempts=1,
                    )
                    s.commit()
                    job_id = job.id
                urls = [f"/v1/jobs/{job_id}", "/v1/jobs", f"/v1/jobs/{job_id}/metrics"] * 20
                answers = await asyncio.gather(*(client.get(u) for u in urls))
                return [r.status_code for r in answers]

    codes = asyncio.run(asyncio.wait_for(run(), timeout=60))
    assert codes == [200] * 60
