"""Killing a one-worker ``ProcessPoolExecutor`` whose child may be stuck (the planner's child,
the request-body checker's): the executor's own shutdown waits for the work or leaves the
process running, so its processes are killed here."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

__all__ = ["pool_processes", "kill_pool"]


def pool_processes(pool: ProcessPoolExecutor) -> list[multiprocessing.Process]:
    """The processes ``pool`` has started (none before its first submit)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down without waiting, then kill its processes (at most 5 s each)."""
    children = pool_processes(pool)
    pool.shutdown(wait=False, cancel_futures=True)
    for child in children:
        child.kill()
        child.join(5)
