"""A hard memory cap on the process running one job.

The plan's estimate is checked at submission and again by the worker, but an estimate can
fall short, and a data file can hold more than its header admits to the planner. So the pool
child running a job (a fresh one per job: ``worker_max_tasks_per_child = 1``) limits itself
before it builds anything: an allocation past the cap fails inside the job (numpy's
``MemoryError``, torch's "DefaultCPUAllocator: can't allocate memory") and the job fails as
``oom`` (:mod:`worker.problems`), while the worker's main process, the machine and every
other job keep their memory.

The limit is ``RLIMIT_DATA`` where the kernel counts anonymous mappings in it (Linux 4.7 and
later: private writable memory, what a job allocates; file mappings such as a memory-mapped
array and address space merely reserved, as CUDA reserves it, are not counted), else
``RLIMIT_AS``, the whole address space. It is set to what the process already has (its
imports: Python, torch, the database driver) plus ``COMERA_WORKER_MEMORY_BYTES``, as a soft
limit under an unchanged hard limit, so the worker can lift it again to record the failure.
Nothing is capped where neither limit exists (not Linux).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MemoryCap", "apply_cap"]


@dataclass(frozen=True)
class MemoryCap:
    kind: str  # "data", "as" or "none"
    baseline: int  # bytes the process had when capped
    limit: int  # the soft limit set (0 when none)
    restore: Callable[[], None]


def _kernel_counts_anonymous_data() -> bool:
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return platform.system() == "Linux" and m is not None and (int(m[1]), int(m[2])) >= (4, 7)


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmData``, ``VmSize``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def apply_cap(budget: int) -> MemoryCap:
    """Cap this process at its current size plus ``budget`` bytes (see the module doc)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return MemoryCap("none", 0, 0, lambda: None)
    use_data = _kernel_counts_anonymous_data()
    kind, which, field = (
        ("data", resource.RLIMIT_DATA, "VmData")
        if use_data
        else ("as", resource.RLIMIT_AS, "VmSize")
    )
    try:
        baseline = _status_bytes(field)
    except OSError:
        return MemoryCap("none", 0, 0, lambda: None)
    soft, hard = resource.getrlimit(which)
    limit = baseline + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(which, (limit, hard))

    def restore() -> None:
        resource.setrlimit(which, (soft, hard))

    return MemoryCap(kind, baseline, limit, restore)


def current_bytes(kind: str) -> int:
    """What the cap of ``kind`` counts now (``VmData`` or ``VmSize``); 0 if unknown."""
    try:
        return _status_bytes("VmData" if kind == "data" else "VmSize") if kind != "none" else 0
    except OSError:
        return 0
