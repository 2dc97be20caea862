"""The planner pool: tenants share it fairly, and no plan outlives its deadline.

Before, one planner process served every tenant and a request waited on it for up to 60 s:
``dataset.params.n_words: 1e9`` held it for that long and another tenant's ordinary
``:validate`` took 64 s. Most tests here drive the pool with stand-in children (threads that
answer when told to), so the timings are exact; one kills a real stuck process.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from service.main import create_app
from service.planner import Planner, PlannerBusy, PlanThrottled
from service.planner_child import PlannerChild
from service.store.db.migrate import upgrade
from service.store.settings import Settings
from tests.helpers.services import wait_for

OK = {"status": "ok", "plan": {"ok": True}}


class GatedChild:
    """A stand-in child: each plan waits until its job's ``gate`` is set (or ``hold`` s); a
    job's ``entered`` event, if it has one, is set once a child has it."""

    def __init__(self) -> None:
        self.started = False
        self.killed = 0
        self._threads = ThreadPoolExecutor(1)

    def start(self, timeout_s: float) -> None:
        self.started = True

    def submit(self, job: dict[str, Any], options: dict[str, Any]) -> Future[dict[str, Any]]:
        if "entered" in job:
            job["entered"].set()

        def run() -> dict[str, Any]:
            job["gate"].wait(job.get("hold", 30))
            return OK

        return self._threads.submit(run)

    def pids(self) -> list[int]:
        return []

    def kill(self) -> None:
        self.started = False
        self.killed += 1
        self._threads = ThreadPoolExecutor(1)  # the stuck plan is left behind, as if killed


def _gated(gate: threading.Event) -> dict[str, Any]:
    return {"gate": gate, "entered": threading.Event()}


def _in_thread(fn, *args, **kwargs) -> Future:
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001
            fut.set_exception(err)

    threading.Thread(target=run, daemon=True).start()
    return fut


def test_a_tenant_over_its_share_is_refused_while_another_is_planned_at_once():
    planner = Planner(processes=2, timeout_s=10, child=GatedChild)
    gate = threading.Event()
    job = _gated(gate)
    first = _in_thread(planner.plan, job, tenant="a", per_tenant=1)
    assert job["entered"].wait(10)  # tenant a's plan is running
    with pytest.raises(PlanThrottled) as err:
        planner.plan({"gate": gate}, tenant="a", per_tenant=1)
    assert err.value.retry_after >= 1
    start = time.perf_counter()
    assert planner.plan({"gate": threading.Event(), "hold": 0.01}, tenant="b", per_tenant=1) == {
        "ok": True
    }
    # tenant b never waited on tenant a (whose gate opens only below): bounded for a loaded host
    assert time.perf_counter() - start < 5.0
    gate.set()
    assert first.result(5) == {"ok": True}
    assert planner.plan({"gate": gate}, tenant="a", per_tenant=1) == {"ok": True}  # freed


def test_a_tenants_next_plans_wait_their_turn_in_a_short_queue():
    planner = Planner(processes=2, timeout_s=10, child=GatedChild)
    first_gate, second_gate = threading.Event(), threading.Event()
    job = _gated(first_gate)
    first = _in_thread(planner.plan, job, tenant="a", per_tenant=1)
    assert job["entered"].wait(10)
    second = _in_thread(
        planner.plan, {"gate": second_gate}, tenant="a", per_tenant=1, queue_per_tenant=1
    )
    wait_for(lambda: planner._tenants["a"].waiting == 1, 10, "tenant a's second plan to wait")
    with pytest.raises(PlanThrottled):  # the queue of one is taken
        planner.plan({"gate": second_gate}, tenant="a", per_tenant=1, queue_per_tenant=1)
    second_gate.set()  # the second may finish at once, but has not even started: a's turn
    time.sleep(0.3)
    assert not second.done()
    first_gate.set()
    assert first.result(5) == second.result(5) == {"ok": True}
    assert planner._tenants == {}


def test_waiting_for_a_busy_planner_ends_at_the_deadline_with_busy():
    planner = Planner(processes=1, timeout_s=10, child=GatedChild)
    gate = threading.Event()
    job = _gated(gate)
    holder = _in_thread(planner.plan, job, tenant="a", timeout_s=10)
    assert job["entered"].wait(10)  # the only child is taken
    start = time.perf_counter()
    with pytest.raises(PlannerBusy, match="busy"):
        planner.plan({"gate": gate}, tenant="b", timeout_s=0.5)
    assert 0.4 < time.perf_counter() - start < 5.0  # the 0.5 s deadline, on a loaded host
    gate.set()
    holder.result(5)


def test_a_plan_past_its_deadline_is_busy_and_its_child_killed_and_replaced():
    planner = Planner(processes=1, timeout_s=0.3, child=GatedChild)
    (child,) = planner._children
    start = time.perf_counter()
    with pytest.raises(PlannerBusy, match="longer than 0.3 s"):
        planner.plan({"gate": threading.Event()}, tenant="a")
    assert time.perf_counter() - start < 5.0  # the 0.3 s deadline, on a loaded host
    assert child.killed == 1
    # restarted off the request; the next plan has the child again
    assert planner.plan({"gate": threading.Event(), "hold": 0.01}, tenant="a") == {"ok": True}
    assert planner._tenants == {}  # every slot given back


def sleep_forever(job: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A plan that never ends (runs in a real spawned child)."""
    time.sleep(3600)
    return OK


def test_a_real_stuck_plan_is_killed_at_the_deadline():
    planner = Planner(processes=1, timeout_s=1.0, child=lambda: PlannerChild(target=sleep_forever))
    try:
        planner._children[0].start(300)  # spawn and import first: not the request's time
        (pid,) = planner.pids()
        start = time.perf_counter()
        with pytest.raises(PlannerBusy):
            planner.plan({}, tenant="a")
        assert time.perf_counter() - start < 5
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the stuck planner {pid} is still running")
    finally:
        planner.close()


def test_warm_starts_every_idle_child_off_the_request():
    planner = Planner(processes=2, timeout_s=10, child=GatedChild)
    assert not any(c.started for c in planner._children)
    planner.warm()
    assert all(c.started for c in planner._children)
    assert planner._idle.qsize() == 2  # every child back in the idle queue


def test_the_app_warms_its_planner_at_start_up(tmp_path):
    """Started by the app's lifespan, before any request: the first submission does not pay
    for a planner's spawn and torch import."""
    app = create_app(
        Settings(
            home=tmp_path, database_url=f"sqlite:///{tmp_path}/db.sqlite", broker_url="memory://"
        )
    )
    app.state.planner = planner = Planner(processes=2, timeout_s=10, child=GatedChild)

    async def start() -> None:
        async with app.router.lifespan_context(app):
            for _ in range(400):  # 20 s for a loaded host
                if all(c.started for c in planner._children):
                    return
                await asyncio.sleep(0.05)

    upgrade(f"sqlite:///{tmp_path}/db.sqlite")
    asyncio.run(start())
    assert all(c.started for c in planner._children)
