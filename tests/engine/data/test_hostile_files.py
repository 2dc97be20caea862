"""Hostile data files under the data root reach the loaders unchecked: each is a DataError
(the job's ``data_error``), never another exception or an allocation sized by a header's
claim (docs/input-limits.md#files-a-job-reads; found by ``test_fuzz_loaders.py``)."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from engine.data import DataConfig, DataError, build_data
from engine.data.arrays import npz_headers, read_npz
from engine.data.criteo import read_criteo
from engine.data.text import read_jsonl_pairs
from engine.models.hf_bert.config import read_architecture
from tests.helpers.hostile_files import (
    corrupt_deflate,
    npy,
    npz_of,
    patch_members,
    valid_npz,
)
from tests.helpers.peak_memory import peak_memory

Y6 = npy((6,), "<i8", data=bytes(48))
NPZ = {
    "encrypted": (patch_members(valid_npz(), flag=0x1), "x: the member is encrypted"),
    "method 9": (patch_members(valid_npz(deflated=True), method=9), "compression method 9"),
    "corrupt deflate": (corrupt_deflate(valid_npz(deflated=True), "x.npy"), "readable .npz"),
    "negative rows": (
        npz_of({"x.npy": npy((-6, 3)), "y.npy": npy((-6,), "<i8")}),
        "integers >= 0",
    ),
    "fortran bomb": (  # 10**7 x 8 float32 declared (320 MB), 72 bytes present
        npz_of({"x.npy": npy((10**7, 8), fortran=True, data=bytes(72)), "y.npy": Y6}),
        "the header declares 320000000 bytes",
    ),
}


def _epoch(path: Path) -> int:
    bundle = build_data(DataConfig(kind="npz", train=str(path)), arch="mlp", batch_size=2, seed=0)
    return sum(1 for _ in bundle.train.batches(0))


@pytest.mark.parametrize("case", sorted(NPZ))
def test_a_damaged_or_lying_npz_is_a_data_error(case: str, tmp_path: Path):
    data, words = NPZ[case]
    path = tmp_path / "train.npz"
    path.write_bytes(data)
    with peak_memory() as peak, pytest.raises(DataError, match=words):
        _epoch(path)
    assert peak.traced < 8 << 20  # the fortran bomb allocated 320 MB


def _claim_size(data: bytes, member: str, size: int) -> bytes:
    """``data`` (a zip) with ``member``'s uncompressed size set to ``size`` in its local and
    central headers (its stream and CRC untouched)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        local = zf.getinfo(member).header_offset
    central = data.find(b"PK\x01\x02", data.find(b"PK\x01\x02"))
    while data[central + 46 : central + 46 + len(member)] != member.encode():
        central = data.find(b"PK\x01\x02", central + 4)
    out = bytearray(data)
    struct.pack_into("<I", out, local + 22, size)
    struct.pack_into("<I", out, central + 24, size)
    return bytes(out)


def test_a_fortran_member_is_read_as_its_data_comes(tmp_path: Path):
    """x Fortran-ordered: read whole, as before; and when the zip entry backs the header's
    claim (320 MB) but its stream holds 72 bytes, only reading finds the lie, and nothing
    is allocated from the claim first (numpy's read_array allocated it all)."""
    x = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(6, 4))
    buf = io.BytesIO()
    np.savez_compressed(buf, x=x, y=np.arange(6) % 2)
    path = tmp_path / "train.npz"
    path.write_bytes(buf.getvalue())
    assert npz_headers(path)[0].fortran_order and _epoch(path) == 3
    assert [r.tolist() for r, _ in read_npz(path)] == x.tolist()

    member = npy((6, 13_333_334), fortran=True, data=bytes(72))  # 6 rows of 53 MB
    lying = npz_of({"x.npy": member, "y.npy": Y6}, deflated=True)
    header = len(member) - 72
    path.write_bytes(_claim_size(lying, "x.npy", header + 6 * 13_333_334 * 4))
    with peak_memory() as peak, pytest.raises(DataError, match="ends early|readable|by rows"):
        _epoch(path)
    assert peak.traced < 8 << 20


def _jsonl(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text('{"premise": "a", "hypothesis": "b", "label": "x"}\n' + line + "\n")
    return path


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("[" * 3000 + "]" * 3000, "nested too deeply"),  # RecursionError
        ('{"premise": "a", "hypothesis": "b", "label": ' + "9" * 5000 + "}", "4300"),
        ('{"premise": "a", "hypothesis": ' + "[" * 900 + "]" * 900 + ', "label": "x"}', "..."),
        ('{"premise": "a", ' + ", ".join(f'"k{i}": 0' for i in range(10**4)) + "}", "..."),
    ],
    ids=["nested", "digits", "nested value", "many keys"],
)
def test_bad_jsonl_rows_are_data_errors_with_short_messages(tmp_path: Path, line, words):
    path = _jsonl(tmp_path, line)
    with pytest.raises(DataError, match="train.jsonl:2: expected") as err:
        list(read_jsonl_pairs(path, "premise", "hypothesis", "label"))
    assert words in str(err.value) and len(str(err.value)) < 500


def test_a_criteo_count_past_python_digit_limit_is_a_data_error(tmp_path: Path):
    path = tmp_path / "train.tsv"
    path.write_text("\t".join(["1", "9" * 5000, *["3"] * 12, *["a1b2"] * 26]) + "\n")
    with pytest.raises(DataError, match="train.tsv:1: expected integer counts within 64 bits"):
        list(read_criteo(path, (10,) * 26))


def test_a_config_json_nested_too_deep_is_a_value_error(tmp_path: Path):
    """The planner and the worker read config.json again after the service's check (which
    refuses it first); RecursionError escaped as a planner or worker error."""
    (tmp_path / "config.json").write_text('{"a": ' + "[" * 3000 + "]" * 3000 + "}")
    with pytest.raises(ValueError, match="cannot read .*config.json as JSON"):
        read_architecture(tmp_path)
