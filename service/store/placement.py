"""Where a job runs: the queue of its placement (devices per node, nodes).

A job goes to the queue of its placement, so that a worker only takes the jobs its machine can
run: ``service.store.queue.enqueue`` sends it there, the reaper re-sends it there, and
``comera worker --devices N [--nodes M]`` consumes it (``service.cli.worker_command``). With
``COMERA_QUEUE=gpu.any`` (the default):

=====================================  ==================  ==================================
the spec's ``training``                queue               consumed by
=====================================  ==================  ==================================
``devices: 1`` (the default)           ``gpu.any``         ``comera worker``
``devices: N`` (N > 1), ``nodes: 1``   ``gpu.any.xN``      ``comera worker --devices N``
``devices: N``, ``nodes: M`` (M > 1)   ``gpu.any.nMxN``    ``comera worker --nodes M
                                                           --devices N`` (a Ray Train driver)
=====================================  ==================  ==================================

Nothing here imports Celery: the API computes placements where the worker package is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["placement", "queue_name"]


def queue_name(base: str, *, devices: int = 1, nodes: int = 1) -> str:
    """The queue of a job on ``devices`` per node and ``nodes`` machines (module doc)."""
    if nodes > 1:
        return f"{base}.n{nodes}x{devices}"
    return f"{base}.x{devices}" if devices > 1 else base


def placement(spec: Mapping[str, Any] | None) -> dict[str, int]:
    """``{"devices": d, "nodes": n}`` of a stored job spec (1 each when it names none)."""
    training = (spec or {}).get("training") or {}
    return {"devices": int(training.get("devices") or 1), "nodes": int(training.get("nodes") or 1)}
