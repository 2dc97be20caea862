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

from service.upload_checks import UploadRejected, check_format
from tests.helpers.file_mutations import FORMATS
from tests.helpers.fuzz import fuzz_files

EXAMPLES = {"jsonl": 200, "csv": 200, "criteo": 200, "text": 200, "npz": 400}
MAX_RSS = 64 << 20  # bytes the resident set may grow (allocator caches and Rust included)
MAX_TRACED = 16 << 20  # bytes; the files are at most a few hundred KB


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_uploads_are_accepted_or_refused_with_a_422(fmt: str, tmp_path: Path):
    path = tmp_path / "upload"
    seen = fuzz_files(
        fmt,
        path,
        EXAMPLES[fmt],
        lambda: check_format(path, fmt),
        UploadRejected,
        max_traced=MAX_TRACED,
        max_rss=MAX_RSS,
    )
    print(
        f"upload check {fmt}: {seen.files} files (largest {seen.largest} bytes), "
        f"{seen.accepted} accepted, {seen.refused} refused (422), 0 other exceptions; "
        f"{seen.peaks()}"
    )
    assert seen.refused > 0
