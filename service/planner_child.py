"""One planner process: a spawned child that imports ``worker.plan`` and answers plan requests.

Planning builds the model (torch), and the API process must never import torch, so plans run
in children started with the ``spawn`` context (no fork of a process with threads and
sockets). A :class:`PlannerChild` wraps a one-worker ``ProcessPoolExecutor``: started and
warmed (``worker.plan`` imported) before its first plan, killed when a plan runs past its
deadline or the pool breaks, and started afresh afterwards. Every child exits as soon as the
API process does, however that ends (a SIGKILL runs no clean-up).

A request carries the job as :func:`service.store.prepare.prepare_job` prepared it (its engine
config, the dataset reference of its spec): the child plans it and neither resolves nor
translates anything. This is the one place ``service`` imports ``worker``: inside the
functions the child runs, never when this module loads (``tests/test_layering.py`` allows
exactly this import).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from service.process_pools import kill_pool, pool_processes

__all__ = ["PlannerChild", "plan_in_child"]


def _exit_with_parent() -> None:
    """Child initializer: exit as soon as the API process is gone (its sentinel closes)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(0)

    threading.Thread(target=watch, name="planner-parent-watch", daemon=True).start()


def _warm() -> bool:
    """Import the planner's code once, so the first real plan pays no torch import."""
    try:
        import worker.plan  # noqa: F401  (runs in the child only)
    except ImportError:
        return False
    return True


def plan_in_child(job: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child: never raises (exceptions do not always survive pickling).

    ``status`` is ``ok`` (with the plan), ``invalid`` (the spec's fault: ``pointer`` into the
    submitted body, or the engine's dotted ``field``, and a ``message``) or ``unavailable``."""
    try:
        from worker.plan import plan_job  # in the child only
    except ImportError as err:
        return {"status": "unavailable", "message": f"worker.plan cannot be imported: {err}"}
    try:
        return {"status": "ok", "plan": plan_job(job, **options)}
    except ValueError as err:  # SpecError (.pointer), engine ConfigError (.field), ValueError
        pointer = getattr(err, "pointer", None)
        if pointer is not None:
            return {"status": "invalid", "pointer": pointer, "message": err.message}  # type: ignore[attr-defined]
        field = getattr(err, "field", None)
        message = str(err)
        if field and message.startswith(f"{field}: "):
            message = message[len(field) + 2 :]
        return {"status": "invalid", "field": field, "message": message}
    except MemoryError:
        return {"status": "invalid", "pointer": "", "message": "planning ran out of memory"}
    except Exception as err:  # noqa: BLE001 (a planner bug must not fail the request)
        return {"status": "unavailable", "message": f"planner error: {err!r}"}


class PlannerChild:
    """One spawned process (started on demand); not thread-safe: one request uses it at once."""

    def __init__(self, target: Callable[..., dict[str, Any]] = plan_in_child) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._target = target  # a module-level function (the child imports it by name)

    @property
    def started(self) -> bool:
        return self._pool is not None

    def start(self, timeout_s: float) -> None:
        """Start the process and import the planner in it (raises on failure or timeout)."""
        if self._pool is not None:
            return
        self._pool = ProcessPoolExecutor(
            max_workers=1, mp_context=mp.get_context("spawn"), initializer=_exit_with_parent
        )
        try:
            if not self._pool.submit(_warm).result(timeout_s):
                raise ImportError("worker.plan cannot be imported")
        except BaseException:
            self.kill()
            raise

    def submit(self, job: dict[str, Any], options: dict[str, Any]) -> Future[dict[str, Any]]:
        assert self._pool is not None, "start() first"
        return self._pool.submit(self._target, job, options)

    def pids(self) -> list[int]:
        pool = self._pool
        return [p.pid for p in pool_processes(pool) if p.pid] if pool is not None else []

    def kill(self) -> None:
        """Stop the process now (it may be stuck in a plan); never waits on it long."""
        pool, self._pool = self._pool, None
        if pool is not None:
            kill_pool(pool)
