"""Hostile dataset uploads are 422s naming the line or member, never a 500
(docs/input-limits.md#uploaded-data-files):
deep JSON, long lines, wide CSV, corrupt or lying NPZ archives."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from service.upload_checks import MAX_COLUMNS, MAX_LINE_BYTES, UploadRejected, check_format
from service.upload_npz import MAX_MEMBERS
from tests.helpers.hostile_files import (
    corrupt_deflate,
    nested_json,
    npy,
    npz_of,
    patch_members,
    valid_npz,
)
from tests.service.api_helpers import Api

OCTET = {"content-type": "application/octet-stream"}
Y6 = npy((6,), "<i8", data=bytes(48))


def _too_many_members() -> bytes:
    """A valid zip whose end record claims more members than allowed (the directory itself
    would be parsed, at a cost in memory, if the claim were not checked first)."""
    data = bytearray(valid_npz())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, MAX_MEMBERS + 1, MAX_MEMBERS + 1)
    return bytes(data)


NPZ = {
    "deflate stream of x": (corrupt_deflate(valid_npz(deflated=True), "x.npy"), "x.npy"),
    "deflate stream of y": (corrupt_deflate(valid_npz(deflated=True), "y.npy"), "y.npy"),
    "encrypted": (patch_members(valid_npz(), flag=0x1), "encrypted"),
    "method 9": (patch_members(valid_npz(deflated=True), method=9), "compression method 9"),
    "method bzip2": (patch_members(valid_npz(), method=12), "only stored or deflated"),
    "header declares more rows": (
        npz_of({"x.npy": npy((10**6, 3), data=bytes(72)), "y.npy": Y6}),
        "x.npy: the header declares 12000000 bytes",
    ),
    "10**30 rows of nothing": (
        npz_of({"x.npy": npy((10**30, 0)), "y.npy": npy((10**30,), "<i8")}),
        "y.npy: the header declares",
    ),
    "zero features": (
        npz_of({"x.npy": npy((6, 0)), "y.npy": Y6}),
        "at least one feature",
    ),
    "negative rows": (
        npz_of({"x.npy": npy((-6, 3)), "y.npy": npy((-6,), "<i8")}),
        "integers >= 0",
    ),
    "too many members": (_too_many_members(), f"at most {MAX_MEMBERS} members"),
}


def _upload(api: Api, data: bytes, fmt: str):
    return api.client.post(f"/v1/datasets?name=d&format={fmt}", content=data, headers=OCTET)


def _rejected(resp, *words: str) -> str:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    message = resp.json()["errors"][0]["message"]
    assert all(w in message for w in words), message
    return message


@pytest.mark.parametrize("case", sorted(NPZ))
def test_corrupt_or_lying_npz_is_a_422_naming_the_member(api_lite: Api, case: str):
    data, words = NPZ[case]
    _rejected(_upload(api_lite, data, "npz"), words)
    assert list((Path(api_lite.settings.artifacts) / "datasets").iterdir()) == []


def test_npz_as_numpy_writes_it_still_passes(api_lite: Api):
    for data in (valid_npz(), valid_npz(deflated=True)):
        resp = _upload(api_lite, data, "npz")
        assert resp.status_code == 201 and resp.json()["rows"] == 6, resp.text
    buf = io.BytesIO()
    np.savez(buf, x=np.zeros((4, 2, 3), np.float16, order="F"), y=np.arange(4, dtype=np.uint8))
    assert _upload(api_lite, buf.getvalue(), "npz").status_code == 201


def test_deep_jsonl_is_a_422_naming_the_line(api_lite: Api):
    ok = nested_json(64) + "\n"
    assert _upload(api_lite, ok.encode(), "jsonl").status_code == 201
    too_deep = '{"a": 1}\n' + nested_json(65) + "\n"
    _rejected(_upload(api_lite, too_deep.encode(), "jsonl"), "line 2", "deeper than 64")
    bomb = nested_json(2000) + "\n"  # RecursionError in json.loads: was a 500
    _rejected(_upload(api_lite, bomb.encode(), "jsonl"), "line 1", "deeper than 64")


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "upload"
    path.write_bytes(data)
    return path


CRITEO_OK = b"\t".join([b"1", *[b"3"] * 13, *[b"a1b2"] * 26])
FIRST = {"jsonl": b'{"a": 1}', "csv": b"a,b\n1,2", "criteo": CRITEO_OK, "text": b"ok"}


@pytest.mark.parametrize("fmt", sorted(FIRST))
def test_a_line_longer_than_the_limit_is_refused_before_it_is_read(tmp_path: Path, fmt: str):
    lines = FIRST[fmt].count(b"\n") + 1
    long_line = b"7" * (MAX_LINE_BYTES + 1)
    with pytest.raises(UploadRejected, match=f"line {lines + 1}: longer than"):
        check_format(_file(tmp_path, FIRST[fmt] + b"\n" + long_line + b"\n"), fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_the_longest_line_allowed_passes(tmp_path: Path, fmt: str):
    fitting = b"z" * MAX_LINE_BYTES if fmt == "text" else b'{"a": "' + b"z" * 100
    if fmt == "jsonl":
        fitting += b"z" * (MAX_LINE_BYTES - len(fitting) - 2) + b'"}'
    assert len(fitting) == MAX_LINE_BYTES
    assert check_format(_file(tmp_path, FIRST[fmt] + b"\n" + fitting), fmt) == 2


def test_csv_header_wider_than_the_limit_is_refused(tmp_path: Path):
    header = ",".join(f"c{i}" for i in range(MAX_COLUMNS + 1)).encode()
    with pytest.raises(UploadRejected, match=f"at most {MAX_COLUMNS}"):
        check_format(_file(tmp_path, header + b"\n" + b"1," * MAX_COLUMNS + b"1\n"), "csv")


def test_npz_directory_larger_than_the_limit_is_refused(tmp_path: Path):
    """Twenty valid members with 64 KB comments: a 1.3 MB directory, refused from its end
    record before zipfile parses it (its parse costs memory in proportion)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in ["x", "y", *(f"m{i}" for i in range(18))]:
            info = zipfile.ZipInfo(f"{name}.npy")
            info.comment = b"c" * 65_000
            zf.writestr(info, Y6 if name != "x" else npy((6, 1), "<i8", data=bytes(48)))
    assert zipfile.ZipFile(buf).testzip() is None  # a well-formed zip
    with pytest.raises(UploadRejected, match="directory is larger than"):
        check_format(_file(tmp_path, buf.getvalue()), "npz")


def test_criteo_counts_longer_than_19_digits_are_refused(tmp_path: Path):
    """The engine keeps counts as 64-bit integers; 5,000 digits made it raise a ValueError."""
    fine = b"\t".join([b"1", b"-" + b"9" * 19, *[b"3"] * 12, *[b"a1b2"] * 26])
    assert check_format(_file(tmp_path, fine + b"\n"), "criteo") == 1
    for digits in (20, 5000):
        line = b"\t".join([b"1", b"9" * digits, *[b"3"] * 12, *[b"a1b2"] * 26])
        with pytest.raises(UploadRejected, match="line 1: expected an integer of at most 19"):
            check_format(_file(tmp_path, line + b"\n"), "criteo")
