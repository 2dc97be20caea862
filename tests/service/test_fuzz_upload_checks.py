"""Data-file fuzzing of the upload checks (docs/input-limits.md#fuzzing): damaged files of
every accepted format
(``tests/helpers/file_mutations.py``) are accepted or refused with ``UploadRejected`` (the
upload's 422) and nothing else, within a bounded peak of memory.

Examples are derandomized (the same files every run, so CI is reproducible); the figures
(files tried, accepted, refused, peak memory) are printed (``pytest -s``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from service.upload_checks import UploadRejected, check_format
from tests.helpers.file_mutations import FORMATS, damaged
from tests.helpers.peak_memory import peak_memory

EXAMPLES = {"jsonl": 200, "csv": 200, "criteo": 200, "text": 200, "npz": 400}
MAX_RSS = 64 << 20  # bytes the resident set may grow (allocator caches and Rust included)
MAX_TRACED = 16 << 20  # bytes; the files are at most a few hundred KB


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_uploads_are_accepted_or_refused_with_a_422(fmt: str, tmp_path: Path):
    path = tmp_path / "upload"
    seen = {"files": 0, "accepted": 0, "refused": 0, "traced": 0, "rss": 0, "largest": 0}

    @settings(
        max_examples=EXAMPLES[fmt],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(damaged(fmt))
    def check(data: bytes) -> None:
        path.write_bytes(data)
        with peak_memory() as peak:
            try:
                check_format(path, fmt)
                seen["accepted"] += 1
            except UploadRejected:
                seen["refused"] += 1
        seen["files"] += 1
        seen["largest"] = max(seen["largest"], len(data))
        seen["traced"] = max(seen["traced"], peak.traced)
        seen["rss"] = max(seen["rss"], peak.rss)
        assert peak.traced <= MAX_TRACED and peak.rss <= MAX_RSS, (len(data), peak)

    check()
    print(
        f"upload check {fmt}: {seen['files']} files (largest {seen['largest']} bytes), "
        f"{seen['accepted']} accepted, {seen['refused']} refused (422), 0 other exceptions; "
        f"peak traced {seen['traced'] / 2**20:.2f} MiB, "
        f"peak RSS growth {seen['rss'] / 2**20:.2f} MiB"
    )
    assert seen["refused"] > 0
