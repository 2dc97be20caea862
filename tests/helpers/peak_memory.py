"""Peak memory of a block of code (pytest-free), measured two ways.

* ``traced``: the peak of :mod:`tracemalloc` (every Python object and every numpy array
  buffer; not torch tensors or Rust allocations);
* ``rss``: how far the process's resident-set high-water mark rose above its size at the
  start (Linux: ``VmHWM`` of ``/proc/self/status``, reset by writing 5 to
  ``/proc/self/clear_refs``; 0 where that is not available). Everything the process touches
  counts, allocator caches included.
"""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peak", "peak_memory"]

_STATUS = Path("/proc/self/status")


@dataclass
class Peak:
    traced: int = 0  # bytes
    rss: int = 0  # bytes


def _status_kb(field: str) -> int:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return 0
    return int(match[1]) if match else 0


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextmanager
def peak_memory() -> Iterator[Peak]:
    """``with peak_memory() as peak: ...``; ``peak`` is filled in when the block ends."""
    peak = Peak()
    resettable = _reset_high_water_mark()
    start = _status_kb("VmRSS")
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        yield peak
    finally:
        peak.traced = tracemalloc.get_traced_memory()[1]
        if not tracing:
            tracemalloc.stop()
        if resettable:
            peak.rss = max(0, _status_kb("VmHWM") - start) * 1024
