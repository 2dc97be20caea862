"""Row blocks of a Fortran-ordered ``.npy`` member of an NPZ archive, never the whole array
unless it is small.

In Fortran order a row's features lie ``N`` items apart, so rows cannot be streamed from the
member's bytes in order. A *stored* member (``np.savez``) is memory-mapped where it lies in
the archive and copied out a block of rows at a time: the pages come from the file (the page
cache, not the process's own memory) and only the block is held. A *deflated* member
(``np.savez_compressed``) cannot be mapped; it is decompressed into memory only when its data
is at most ``FORTRAN_IN_MEMORY_MAX_BYTES`` (checked against what the header declares before
anything is read, and again as the data comes), and refused with a :class:`DataError` saying
how to save it otherwise. A 413 KB upload declaring a (25,000,000 x 4) float32 Fortran ``x``
took 1,573 MB in the worker before; now it is a 422 at submission (the planner calls
:func:`fortran_bytes_in_memory`), and a stored one trains in constant memory.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from engine.data.errors import DataError

__all__ = ["FORTRAN_IN_MEMORY_MAX_BYTES", "fortran_blocks", "fortran_bytes_in_memory"]

FORTRAN_IN_MEMORY_MAX_BYTES = 256 << 20
CHUNK_BYTES = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature ... file name length, extra length


def _too_large(path: str | Path, member: str, nbytes: int) -> DataError:
    return DataError(
        path,
        None,
        f"{member}: a compressed Fortran-ordered array of {nbytes:,} bytes cannot be read by "
        f"rows, and only {FORTRAN_IN_MEMORY_MAX_BYTES >> 20} MiB are read whole: save it "
        "uncompressed (np.savez) or in C order (np.ascontiguousarray)",
    )


def fortran_bytes_in_memory(
    path: str | Path, member: str, info: zipfile.ZipInfo, nbytes: int
) -> int:
    """Bytes a Fortran-ordered ``member`` (``info``, ``nbytes`` of data) takes in memory when
    read: 0 when stored (mapped), its size when deflated; a DataError past the limit."""
    if info.compress_type == zipfile.ZIP_STORED:
        return 0
    if nbytes > FORTRAN_IN_MEMORY_MAX_BYTES:
        raise _too_large(path, member, nbytes)
    return nbytes


def _data_offset(path: str | Path, info: zipfile.ZipInfo, header_bytes: int) -> int:
    """Where a stored member's array data starts in the archive file."""
    with open(path, "rb") as fp:
        fp.seek(info.header_offset)
        raw = fp.read(_LOCAL_HEADER.size)
    if len(raw) != _LOCAL_HEADER.size or raw[:4] != b"PK\x03\x04":
        raise DataError(path, None, f"{info.filename}: bad local file header")
    fields = _LOCAL_HEADER.unpack(raw)
    name_len, extra_len = fields[-2], fields[-1]
    return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len + header_bytes


def _mapped(
    path: str | Path, info: zipfile.ZipInfo, f: IO[bytes], shape: tuple[int, ...], dtype: Any
) -> np.memmap:
    start = _data_offset(path, info, f.tell())
    nbytes = dtype.itemsize * math.prod(shape)
    if start + nbytes > os.path.getsize(path):
        raise DataError(path, None, f"{info.filename}: the data ends early")
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape, order="F")


def _read_whole(
    f: IO[bytes], shape: tuple[int, ...], dtype: Any, path: str | Path, member: str
) -> np.ndarray:
    nbytes = dtype.itemsize * math.prod(shape)
    data = bytearray()
    while len(data) < nbytes:  # as it comes: a header's lie allocates nothing
        chunk = f.read(min(CHUNK_BYTES, nbytes - len(data)))
        if not chunk:
            raise DataError(path, None, f"{member}: expected {nbytes} bytes, the data ends early")
        data += chunk
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F")


def fortran_blocks(
    zf: zipfile.ZipFile,
    f: IO[bytes],
    shape: tuple[int, ...],
    dtype: Any,
    path: str | Path,
    member: str,
) -> Iterator[np.ndarray]:
    """Row blocks ``(k, *shape[1:])`` (C-ordered copies of about 1 MiB) of the Fortran-ordered
    ``member`` of ``zf``, whose file ``f`` is positioned after the ``.npy`` header."""
    info = zf.getinfo(f"{member}.npy")
    nbytes = dtype.itemsize * math.prod(shape)
    fortran_bytes_in_memory(path, member, info, nbytes)  # refuses before reading
    if info.compress_type == zipfile.ZIP_STORED:
        array: np.ndarray = _mapped(path, info, f, shape, dtype)
    else:
        array = _read_whole(f, shape, dtype, path, member)
    row_bytes = max(1, dtype.itemsize * math.prod(shape[1:]))
    per = max(1, CHUNK_BYTES // row_bytes)
    for start in range(0, shape[0], per):
        yield np.ascontiguousarray(array[start : start + per])  # (k, *shape[1:])
