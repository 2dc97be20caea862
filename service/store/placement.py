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

:func:`parse_queue` reads a queue name back into its placement (``service.store.workers``
compares the placements the registered workers serve with a job's).

Nothing here imports Celery: the API computes placements where the worker package is absent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["parse_queue", "placement", "queue_name"]


def queue_name(base: str, *, devices: int = 1, nodes: int = 1) -> str:
    """The queue of a job on ``devices`` per node and ``nodes`` machines (module doc)."""
    if nodes > 1:
        return f"{base}.n{nodes}x{devices}"
    return f"{base}.x{devices}" if devices > 1 else base


def placement(spec: Mapping[str, Any] | None) -> dict[str, int]:
    """``{"devices": d, "nodes": n}`` of a stored job spec (1 each when it names none)."""
    training = (spec or {}).get("training") or {}
    return {"devices": int(training.get("devices") or 1), "nodes": int(training.get("nodes") or 1)}


_SUFFIX = re.compile(
    r"^(?:\.x(?P<devices>[1-9][0-9]*)|\.n(?P<nodes>[1-9][0-9]*)x(?P<per>[1-9][0-9]*))?$"
)


def parse_queue(base: str, name: str) -> tuple[int, int] | None:
    """``(devices, nodes)`` of the jobs queue ``name`` carries (:func:`queue_name` of ``base``
    read back), None for a queue that is not one of ``base``'s (the reaper's, another base)."""
    if not name.startswith(base):
        return None
    match = _SUFFIX.match(name[len(base) :])
    if match is None:
        return None
    if match["nodes"]:
        return int(match["per"]), int(match["nodes"])
    return int(match["devices"] or 1), 1
