"""One fuzzing run over damaged files (``tests/helpers/file_mutations.py``): each file is
written to a path and read by the code under test, which must accept it or refuse it with
one exception type, within a bounded peak of memory (``tests/helpers/peak_memory.py``).

Examples are derandomized (the same files every run, so CI is reproducible).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from tests.helpers.file_mutations import damaged
from tests.helpers.peak_memory import peak_memory

__all__ = ["Tally", "fuzz_files"]


@dataclass
class Tally:
    """What a run saw: files tried, accepted and refused; the largest file and the peaks."""

    files: int = 0
    accepted: int = 0
    refused: int = 0
    largest: int = 0  # bytes
    traced: int = 0  # bytes
    rss: int = 0  # bytes

    def peaks(self) -> str:
        return (
            f"peak traced {self.traced / 2**20:.2f} MiB, peak RSS growth {self.rss / 2**20:.2f} MiB"
        )


def fuzz_files(
    fmt: str,
    path: Path,
    examples: int,
    read: Callable[[], object],
    refusal: type[Exception],
    *,
    max_traced: int,
    max_rss: int,
) -> Tally:
    """``examples`` damaged ``fmt`` files, each written to ``path`` and read by ``read``:
    it returns (accepted) or raises ``refusal`` (refused); any other exception, or a peak of
    memory above ``max_traced`` / ``max_rss`` bytes, fails the run."""
    tally = Tally()

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(damaged(fmt))
    def one(data: bytes) -> None:
        path.write_bytes(data)
        with peak_memory() as peak:
            try:
                read()
                tally.accepted += 1
            except refusal:
                tally.refused += 1
        tally.files += 1
        tally.largest = max(tally.largest, len(data))
        tally.traced = max(tally.traced, peak.traced)
        tally.rss = max(tally.rss, peak.rss)
        assert peak.traced <= max_traced and peak.rss <= max_rss, (len(data), peak)

    one()
    return tally
