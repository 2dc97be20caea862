"""No request waits on the database from the event loop.

A handler's database work runs in the thread pool, but a session closed on the event loop
while still in a transaction rolls back there: a round trip to the database during which
every other request of the process waits (a fifth of the loop's time when 100 clients poll
``GET /v1/jobs/{id}``, ``bench.api_load``). Every statement, commit, rollback and pool reset
of a request is recorded with whether it ran on a thread with a running event loop.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import event

from tests.service.api_helpers import make_job


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def loop_calls(api):
    """(what, on the event loop) for every database call of the app's engine."""
    engine = api.client.app.state.engine
    calls: list[tuple[str, bool]] = []

    def record(what: str):
        def listener(*_args, **_kwargs) -> None:
            calls.append((what, _on_event_loop()))

        return listener

    listeners = [
        (engine, "before_cursor_execute", record("execute")),
        (engine, "commit", record("commit")),
        (engine, "rollback", record("rollback")),
        (engine.pool, "reset", record("reset")),
        (engine.pool, "checkout", record("checkout")),
    ]
    for target, name, fn in listeners:
        event.listen(target, name, fn)
    yield calls
    for target, name, fn in listeners:
        event.remove(target, name, fn)


def test_polling_a_job_never_touches_the_database_from_the_event_loop(api, loop_calls):
    job_id = make_job(api, state="RUNNING")
    for path in (f"/v1/jobs/{job_id}", "/v1/jobs", f"/v1/jobs/{job_id}/metrics"):
        loop_calls.clear()
        assert api.client.get(path).status_code == 200
        assert loop_calls, "the request made no database call at all"
        on_loop = [what for what, on_loop in loop_calls if on_loop]
        assert on_loop == [], f"GET {path}: {on_loop} ran on the event loop"
