"""PostgreSQL unreachable (a proxy between the API and the database is switched off): the API
answers 503 with Retry-After, as problem+json, stores nothing partial, and recovers."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from tests.faults.proxy import SwitchableProxy
from tests.faults.stack import SPEC, wait_for
from tests.helpers.groups import SERVICES

pytestmark = [pytest.mark.slow, SERVICES]


def _rows(db_url: str) -> tuple[list[str], list[str]]:
    """Job ids and idempotency keys in the database, read directly."""
    engine = create_engine("postgresql+psycopg://" + db_url.removeprefix("postgresql://"))
    try:
        with engine.connect() as conn:
            jobs = list(conn.scalars(text("SELECT id FROM jobs ORDER BY id")))
            keys = list(conn.scalars(text("SELECT key FROM idempotency_keys ORDER BY key")))
    finally:
        engine.dispose()
    return jobs, keys


def _assert_unavailable(r) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert int(r.headers["retry-after"]) > 0
    assert r.json()["status"] == 503


def test_the_api_answers_503_while_the_database_is_unreachable_and_recovers(stack):
    proxy = SwitchableProxy(("127.0.0.1", 5432))
    try:
        db_name = stack.db_url.rsplit("/", 1)[1]
        proxied = {
            **stack.env,
            "COMERA_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{proxy.port}/{db_name}",
        }
        client = stack.api(env=proxied)
        first = stack.submit(client, SPEC, "before-outage")
        assert client.get("/v1/jobs").status_code == 200

        proxy.stop()
        t0 = time.monotonic()
        _assert_unavailable(client.get("/v1/jobs"))
        _assert_unavailable(client.get(f"/v1/jobs/{first['id']}"))
        _assert_unavailable(
            client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "during-outage"})
        )
        _assert_unavailable(client.post(f"/v1/jobs/{first['id']}/cancel"))
        assert client.get("/v1/readyz").status_code == 503
        assert time.monotonic() - t0 < 60  # fast answers, no hanging requests

        proxy.start()
        wait_for(
            lambda: client.get("/v1/jobs").status_code == 200, 60, "the API to recover", stack.logs
        )
        jobs, keys = _rows(stack.db_url)  # nothing half-created while it was down
        assert jobs == [first["id"]] and keys == ["before-outage"]
        assert client.get(f"/v1/jobs/{first['id']}").json()["state"] == "QUEUED"
        second = stack.submit(client, SPEC, "during-outage")  # the key was not kept: a new job
        assert second["id"] != first["id"]
        assert sorted(_rows(stack.db_url)[0]) == sorted([first["id"], second["id"]])
    finally:
        proxy.stop()
