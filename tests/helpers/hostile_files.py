"""Malformed data files for the upload and loader tests (pytest-free): ``.npy`` members with
any header, zips patched after writing (flags, methods, deflate streams), nested JSON.

A zip is patched in place, in its local header and in its central directory alike, so that
:mod:`zipfile` sees the same lie in both (it compares only the name).
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator

import numpy as np

__all__ = [
    "corrupt_deflate",
    "nested_json",
    "npy",
    "npz_of",
    "patch_members",
    "valid_npz",
]

LOCAL, CENTRAL = b"PK\x03\x04", b"PK\x01\x02"


def npy(shape: tuple[int, ...], descr: str = "<f4", *, fortran: bool = False, data=b"") -> bytes:
    """A version 1.0 ``.npy`` member whose header says ``shape`` / ``descr`` / ``fortran``
    whatever ``data`` (the bytes after the header) holds."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}).encode()
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def npz_of(members: dict[str, bytes], *, deflated: bool = False) -> bytes:
    """A zip of ``members`` (name: bytes), stored or deflated."""
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def valid_npz(rows: int = 6, features: int = 3, *, deflated: bool = False) -> bytes:
    """What ``np.savez`` (or ``savez_compressed``) writes for float32 ``x`` and int64 ``y``."""
    buf = io.BytesIO()
    x = np.arange(rows * features, dtype=np.float32).reshape(rows, features)
    (np.savez_compressed if deflated else np.savez)(buf, x=x, y=np.arange(rows) % 3)
    return buf.getvalue()


def _headers(data: bytes) -> Iterator[tuple[str, int]]:
    """``("local" | "central", offset)`` of every header of a well-formed zip."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            yield "local", info.header_offset
    at = data.find(CENTRAL)
    while at >= 0:
        yield "central", at
        at = data.find(CENTRAL, at + 4)


def patch_members(data: bytes, *, flag: int | None = None, method: int | None = None) -> bytes:
    """``data`` with general-purpose ``flag`` bits set and/or the compression ``method``
    replaced in every member's local and central header."""
    out = bytearray(data)
    for kind, at in list(_headers(data)):
        if data[at : at + 4] != (LOCAL if kind == "local" else CENTRAL):
            continue  # an edited zip may point anywhere: only real headers are patched
        flag_at, method_at = (at + 6, at + 8) if kind == "local" else (at + 8, at + 10)
        if flag is not None:
            old = struct.unpack_from("<H", out, flag_at)[0]
            struct.pack_into("<H", out, flag_at, old | flag)
        if method is not None:
            struct.pack_into("<H", out, method_at, method)
    return bytes(out)


def corrupt_deflate(data: bytes, member: str) -> bytes:
    """``data`` (a deflated zip) with the first block of ``member``'s stream made invalid
    (block type 3, reserved): inflating it fails at once."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(member)
    if data[info.header_offset : info.header_offset + 4] != LOCAL:
        return data  # no local header where the directory says
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    if info.compress_size == 0 or start >= len(data):
        return data  # no stream to break
    out = bytearray(data)
    out[start] = 0xFF  # BFINAL 1, BTYPE 11
    return bytes(out)


def nested_json(depth: int, inner: str = "0") -> str:
    """An object whose ``"a"`` holds ``depth - 1`` nested arrays around ``inner``."""
    return '{"a": ' + "[" * (depth - 1) + inner + "]" * (depth - 1) + "}"
