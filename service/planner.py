"""The planner: a pool of spawned processes running ``worker.plan.plan_job``, shared fairly.

What it plans is the job as :func:`service.store.prepare.prepare_job` prepared it (the engine
config stored with the job, the spec's dataset reference for the data's errors): the planner
neither resolves nor translates anything itself.

Every submission and dry run is planned before anything is stored (the model built on the
``meta`` device, the data's real sizes read, the memory estimate checked against the worker's
capacity; :mod:`worker.plan`). One planner process for every tenant let one tenant's slow
plan hold everyone's: ``dataset.params.n_words: 1e9`` held it 60 s, another tenant's
``:validate`` took 64 s, and the submission itself was accepted "without a plan check". So:

* ``COMERA_PLANNER_PROCESSES`` children (:mod:`service.planner_child`), each running one plan
  at a time; a request takes a free one or waits for one;
* a per-request deadline, ``COMERA_PLAN_TIMEOUT_SECONDS``, over the wait and the plan: past it
  the request is a 503 with ``Retry-After`` (:class:`PlannerBusy`) and a plan still running
  is killed with its child, which is started afresh in the background;
* per tenant at most ``COMERA_PLANS_PER_TENANT`` plans at once, so one tenant cannot take
  every child; up to ``COMERA_PLAN_QUEUE_PER_TENANT`` more of its requests wait for its turn
  (within their deadline), and past those a 429 with ``Retry-After`` (:class:`PlanThrottled`):
  waiting requests hold API threads, so the queue is short;
* a plan that could not be made is never "accepted without a plan check", unless the operator
  sets ``COMERA_ACCEPT_UNPLANNED_JOBS`` (then the worker's own plan is the check).

Starting a child (spawn, import torch) is not counted against a request's deadline. Engine
errors name their field as a dotted path of the engine config (``schedule[1].target_ratio``);
:func:`api_schemas.engine_spec.engine_pointer` turns it into a JSON Pointer into the submitted
body, the same one a failed job's problem gives (``worker.problems``).
"""

from __future__ import annotations

import atexit
import concurrent.futures.process
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from api_schemas import JobCreate
from api_schemas.engine_spec import engine_pointer
from service.planner_child import PlannerChild
from service.store.prepare import PreparedJob

__all__ = [
    "PlanFailed",
    "PlanThrottled",
    "Planner",
    "PlannerBusy",
    "PlannerUnavailable",
    "TenantPlanner",
    "default_planner",
]

log = logging.getLogger(__name__)
START_TIMEOUT_S = 300.0  # a child's spawn and torch import (a loaded 2-core host: ~10 s)


class PlannerUnavailable(RuntimeError):
    """No plan could be made (no worker package, a crash): not the user's fault."""

    retry_after = 30


class PlannerBusy(PlannerUnavailable):
    """No plan within the request's deadline (every child busy, or the plan too slow)."""

    retry_after = 5


class PlanThrottled(RuntimeError):
    """The tenant already has its share of plans running or waiting."""

    retry_after = 1


class PlanFailed(ValueError):
    """The engine refused the job: ``pointer`` names the field of the submitted body."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer}: {message}")
        self.pointer, self.message = pointer, message


@dataclass
class _TenantState:
    running: int = 0
    waiting: int = 0


class Planner:
    """``processes`` planner children shared by every request of this process; thread-safe."""

    def __init__(
        self,
        processes: int = 2,
        timeout_s: float = 30.0,
        child: Callable[[], PlannerChild] = PlannerChild,
    ) -> None:
        self.processes, self.timeout_s = processes, timeout_s
        self._children = [child() for _ in range(processes)]
        self._idle: queue.Queue[PlannerChild] = queue.Queue()
        for child in self._children:
            self._idle.put(child)
        self._tenants: dict[str, _TenantState] = {}
        self._cond = threading.Condition()
        self._closed = False

    # -- admission ----------------------------------------------------------------------
    def _enter(
        self, tenant: str | None, per_tenant: int | None, queue_per_tenant: int, deadline: float
    ) -> None:
        """Take one of the tenant's ``per_tenant`` slots, waiting behind at most
        ``queue_per_tenant`` of its requests until ``deadline`` (429 / 503 otherwise)."""
        if tenant is None or per_tenant is None:
            return
        with self._cond:
            state = self._tenants.setdefault(tenant, _TenantState())
            if state.running >= per_tenant:
                if state.waiting >= queue_per_tenant:
                    self._forget(tenant, state)
                    raise PlanThrottled(
                        f"this tenant already has {state.running} plan(s) in progress and "
                        f"{state.waiting} waiting (at most {per_tenant} and {queue_per_tenant})"
                    )
                state.waiting += 1
                try:
                    while state.running >= per_tenant:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise PlannerBusy("this tenant's earlier plans took the whole deadline")
                        self._cond.wait(left)
                finally:
                    state.waiting -= 1
            state.running += 1

    def saturated(self, tenant: str, per_tenant: int, queue_per_tenant: int) -> bool:
        """Whether a plan of ``tenant`` would be throttled now (a cheap early answer: the
        request is refused before its body is read or the store is touched)."""
        with self._cond:
            state = self._tenants.get(tenant)
            return state is not None and (
                state.running >= per_tenant and state.waiting >= queue_per_tenant
            )

    def _leave(self, tenant: str | None, per_tenant: int | None) -> None:
        if tenant is None or per_tenant is None:
            return
        with self._cond:
            state = self._tenants[tenant]
            state.running -= 1
            self._forget(tenant, state)
            self._cond.notify_all()

    def _forget(self, tenant: str, state: _TenantState) -> None:
        if state.running == 0 and state.waiting == 0:
            self._tenants.pop(tenant, None)

    def _release(self, child: PlannerChild) -> None:
        """Back to the idle children; a killed one is started again first, off the request."""
        if self._closed or child.started:
            self._idle.put(child)
            return

        def restart() -> None:
            try:
                child.start(START_TIMEOUT_S)
            except Exception:  # noqa: BLE001 (the next request starts it, or reports why)
                log.warning("a planner child could not be restarted", exc_info=True)
            self._idle.put(child)

        threading.Thread(target=restart, name="planner-restart", daemon=True).start()

    # -- planning -----------------------------------------------------------------------
    def plan(
        self,
        job: dict[str, Any],
        *,
        tenant: str | None = None,
        per_tenant: int | None = None,
        queue_per_tenant: int = 0,
        timeout_s: float | None = None,
        options: dict[str, Any] | None = None,
        spec: JobCreate | None = None,
    ) -> dict[str, Any]:
        """The plan of an engine job dict (``options``: ``worker.plan.plan_job`` keywords):
        at most ``per_tenant`` of ``tenant``'s plans at once, ``queue_per_tenant`` more
        waiting. Raises ``PlanFailed`` (the spec's fault, its pointer into ``spec``, the
        submitted body the job came from), ``PlanThrottled`` (the tenant's limit),
        ``PlannerBusy`` (the deadline) or ``PlannerUnavailable``."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        self._enter(tenant, per_tenant, queue_per_tenant, deadline)
        try:
            try:
                child = self._idle.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise PlannerBusy(f"every planner was busy for {timeout:g} s") from None
            try:
                out = self._run(child, job, options or {}, deadline, timeout)
            finally:
                self._release(child)
        finally:
            self._leave(tenant, per_tenant)
        if out["status"] == "invalid":
            pointer = out.get("pointer")
            if pointer is None:
                pointer = engine_pointer(out.get("field"), spec)
            raise PlanFailed(pointer, out["message"])
        if out["status"] != "ok":
            raise PlannerUnavailable(out["message"])
        return out["plan"]  # type: ignore[no-any-return]

    def _run(
        self,
        child: PlannerChild,
        job: dict[str, Any],
        options: dict[str, Any],
        deadline: float,
        timeout: float,
    ) -> dict[str, Any]:
        for attempt in (1, 2):  # a child that died since its last plan: once more, fresh
            try:
                if not child.started:
                    start = time.monotonic()
                    child.start(START_TIMEOUT_S)
                    deadline += time.monotonic() - start  # starting is not the request's time
                future = child.submit(job, options)
                return future.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                child.kill()  # it may be stuck: a fresh one next time
                raise PlannerBusy(f"planning took longer than {timeout:g} s") from None
            except BrokenProcessPool:
                child.kill()
                if attempt == 2:
                    raise PlannerUnavailable("the planner process died") from None
            except Exception as err:  # noqa: BLE001 (start-up failure)
                child.kill()
                raise PlannerUnavailable(f"the planner failed: {err!r}") from None
        raise AssertionError("unreachable")

    def warm(self) -> None:
        """Start every child now, off any request (an app calls it in a thread at start-up):
        each is taken from the idle queue while it starts, so a request waits for a started
        child instead of starting one on its own time."""
        for _ in self._children:
            try:
                child = self._idle.get_nowait()
            except queue.Empty:
                return  # the rest are in use: started by their requests
            try:
                if not self._closed:
                    child.start(START_TIMEOUT_S)
            except Exception:  # noqa: BLE001 (a request starts it again, or reports why)
                # close(), or the interpreter's exit (the executor then refuses new work),
                # stops a child mid-start: a shutdown, not a failure worth a traceback
                if not self._closed and not _exiting():
                    log.warning("a planner child could not be started", exc_info=True)
            finally:
                self._idle.put(child)

    def pids(self) -> list[int]:
        """The process ids of the running children."""
        return [pid for child in self._children for pid in child.pids()]

    def close(self) -> None:
        """Stop every child now (killed: they may be stuck in a plan)."""
        self._closed = True
        for child in self._children:
            child.kill()


@dataclass(frozen=True)
class TenantPlanner:
    """The planner as one request of one tenant uses it, with the app's settings."""

    planner: Planner
    tenant: str
    per_tenant: int
    queue_per_tenant: int
    timeout_s: float
    capacity_bytes: int
    accept_unplanned: bool
    baseline: dict[str, int] | None = None  # the workers' process baseline (None: the default)

    def check_turn(self) -> None:
        """Raise ``PlanThrottled`` now if this tenant's plans are at their limit."""
        if self.planner.saturated(self.tenant, self.per_tenant, self.queue_per_tenant):
            raise PlanThrottled(
                f"this tenant already has {self.per_tenant} plan(s) in progress and "
                f"{self.queue_per_tenant} waiting"
            )

    def plan(
        self, job: PreparedJob | dict[str, Any], spec: JobCreate | None = None
    ) -> dict[str, Any]:
        """The plan of ``job``: a prepared job (:func:`service.store.prepare.prepare_job`; its
        engine config, spec and dataset reference), or an engine job dict of ``spec``."""
        if isinstance(job, PreparedJob):
            job, spec, pointer = job.engine_config, spec or job.spec, job.dataset_pointer
        else:
            pointer = engine_pointer("data.train", spec)
        options: dict[str, Any] = {
            "capacity_bytes": self.capacity_bytes,
            "dataset_pointer": pointer,
        }
        if self.baseline is not None:
            options["baseline"] = self.baseline
        return self.planner.plan(
            job,
            tenant=self.tenant,
            per_tenant=self.per_tenant,
            queue_per_tenant=self.queue_per_tenant,
            timeout_s=self.timeout_s,
            options=options,
            spec=spec,
        )


def _exiting() -> bool:
    """The interpreter has begun to exit: :mod:`concurrent.futures` has run its exit hook, so
    every process pool refuses new work (no public flag says so; ``sys.is_finalizing`` turns
    true only later)."""
    return bool(getattr(concurrent.futures.process, "_global_shutdown", False))


_default: Planner | None = None
_default_lock = threading.Lock()


def default_planner(processes: int = 2) -> Planner:
    """The process-wide planner (its children shared by every app in this process; the
    first call decides how many)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Planner(processes)
            atexit.register(_default.close)
        return _default
