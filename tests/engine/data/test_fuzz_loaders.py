"""Data-file fuzzing of the engine's loaders (docs/input-limits.md#fuzzing): damaged files of
every accepted format
(``tests/helpers/file_mutations.py``) go through ``build_data`` and one full epoch of batches,
as a worker would read a file under the data root (which no upload check has seen). Each
either loads or raises :class:`DataError` (the job's ``data_error``, a 422): no other
exception, and a bounded peak of memory whatever a header declares.

Examples are derandomized (the same files every run); the figures (files tried, loaded,
refused, peak memory) are printed (``pytest -s``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from engine.data import DataConfig, DataError, build_data
from tests.helpers.fuzz import fuzz_files
from tests.helpers.hf_bert import minilm_dir

TOKENIZER = str(minilm_dir() / "tokenizer.json")
# (arch, format, DataConfig fields, examples)
CASES = {
    "transformer-jsonl": ("transformer", "jsonl", {"tokenizer": TOKENIZER, "max_len": 32}, 60),
    "transformer-csv": ("transformer", "csv", {"tokenizer": TOKENIZER, "valid_every": 3}, 60),
    "dlrm-criteo": ("dlrm", "criteo", {"num_rows": 64, "valid_every": 2}, 120),
    "mlm-text": ("mlm", "text", {"tokenizer": TOKENIZER, "max_len": 64}, 30),
    "hf_bert-text": ("hf_bert", "text", {"tokenizer": TOKENIZER, "max_len": 64}, 40),
    "mlp-npz": ("mlp", "npz", {"valid_every": 2}, 300),
}
MAX_RSS = 512 << 20  # bytes the resident set may grow (allocator caches and Rust included)
MAX_TRACED = 64 << 20  # bytes; the files are at most a few hundred KB


def _epoch(arch: str, fmt: str, fields: dict, path: Path, workdir: Path) -> int:
    """Batches of one epoch of ``path`` (train and validation) through ``build_data``."""
    config = DataConfig(kind=fmt, train=str(path), shuffle_buffer=8, **fields)
    bundle = build_data(config, arch=arch, batch_size=32, seed=0, workdir=workdir)
    sources = [bundle.train] + ([bundle.valid] if bundle.valid is not None else [])
    return sum(1 for source in sources for _ in source.batches(0))


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_files_load_or_raise_data_error(case: str, tmp_path: Path):
    arch, fmt, fields, examples = CASES[case]
    path = tmp_path / f"train.{fmt}"

    def load() -> None:
        workdir = Path(tempfile.mkdtemp(dir=tmp_path))  # no labels or tokenizer kept
        try:
            _epoch(arch, fmt, fields, path, workdir)
        finally:
            shutil.rmtree(workdir)

    seen = fuzz_files(fmt, path, examples, load, DataError, max_traced=MAX_TRACED, max_rss=MAX_RSS)
    print(
        f"loader {case}: {seen.files} files (largest {seen.largest} bytes), "
        f"{seen.accepted} loaded, {seen.refused} DataError, 0 other exceptions; {seen.peaks()}"
    )
    assert seen.files == examples == seen.accepted + seen.refused
