"""The format check of an uploaded NPZ: a zip of ``.npy`` members, read header by header.

Nothing is decompressed beyond each member's ``.npy`` header and nothing is ever unpickled.
Each limit below is an :class:`UploadRejected` (a 422) naming the member:

* the zip's central directory holds at most ``MAX_MEMBERS`` members in at most
  ``MAX_DIRECTORY_BYTES``, read from the end record before :mod:`zipfile` parses the
  directory (that parse costs memory in proportion to the directory);
* every member is a ``.npy``, stored or deflated (the two methods numpy writes), not
  encrypted, and its data lies inside the file; a deflated member may not declare more than
  ``MAX_DEFLATE_RATIO`` times its compressed size (deflate cannot expand more);
* every ``.npy`` header parses with ``numpy.lib.format`` (version 1-3, at most 10,000
  bytes), its dtype holds no Python objects, its shape is made of integers >= 0 and its data
  size (item size x elements) is exactly what the member holds after the header: a header
  that declares more (or less) than the file carries is refused;
* ``x`` is a real (bool / int / float) array (N, ...) with at least one feature per row and
  ``y`` an (N,) integer array, as the MLP loader reads them.

A corrupt zip (bad deflate stream, bad local header, truncated member) is a 422 as well.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from service.upload_errors import UploadRejected

__all__ = ["MAX_DIRECTORY_BYTES", "MAX_MEMBERS", "check_npz"]

MAX_MEMBERS = 1000
MAX_DIRECTORY_BYTES = 1 << 20
MAX_DEFLATE_RATIO = 1032  # deflate's largest expansion (258-byte matches in ~2 bits)
METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
# what zipfile, zlib and numpy raise on a corrupt member (encryption and methods are checked)
CORRUPT = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError)
LOCAL_HEADER = 30  # bytes before a member's name in its local header


def _open(path: Path) -> zipfile.ZipFile:
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            end = zipfile._EndRecData(f)  # the end record only (zipfile's own reader)
        if end is None:
            raise zipfile.BadZipFile("File is not a zip file")
        if end[zipfile._ECD_ENTRIES_TOTAL] > MAX_MEMBERS:
            raise UploadRejected(f"at most {MAX_MEMBERS} members, the zip declares more")
        if end[zipfile._ECD_SIZE] > MAX_DIRECTORY_BYTES:
            raise UploadRejected(f"the zip directory is larger than {MAX_DIRECTORY_BYTES} bytes")
        zf = zipfile.ZipFile(path)
    except (*CORRUPT, zipfile.LargeZipFile) as err:
        raise UploadRejected(f"not an .npz (zip) archive ({err})") from None
    names = zf.namelist()
    bad = [n for n in names if not n.endswith(".npy")]
    if len(names) > MAX_MEMBERS or bad:
        zf.close()
        raise UploadRejected(
            f"expected only .npy members (at most {MAX_MEMBERS}), got {(bad or names)[:5]}"
        )
    for info in zf.infolist():
        reason = _member_reason(info, size)
        if reason:
            zf.close()
            raise UploadRejected(f"{info.filename}: {reason}")
    return zf


def _member_reason(info: zipfile.ZipInfo, archive_size: int) -> str | None:
    if info.flag_bits & 0x1:
        return "the member is encrypted"
    if info.compress_type not in METHODS:
        return f"compression method {info.compress_type} (only stored or deflated)"
    if info.header_offset + LOCAL_HEADER + info.compress_size > archive_size:
        return "the member's data runs past the end of the file"
    stored = info.compress_type == zipfile.ZIP_STORED
    if info.file_size > (info.compress_size if stored else MAX_DEFLATE_RATIO * info.compress_size):
        return f"declares {info.file_size} bytes, more than its {info.compress_size} can hold"
    return None


def _npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
    name = info.filename
    try:
        with zf.open(info) as f:
            major, _ = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if major == 1
                else np.lib.format.read_array_header_2_0
            )
            shape, _fortran, dtype = read(f)
            header_bytes = f.tell()
    except CORRUPT as err:
        raise UploadRejected(f"{name}: not a .npy array ({err})") from None
    if dtype.hasobject:
        raise UploadRejected(f"{name}: dtype {dtype} holds Python objects (pickles are refused)")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise UploadRejected(f"{name}: expected a shape of integers >= 0, got {shape}")
    declared = dtype.itemsize * math.prod(shape)
    if declared != info.file_size - header_bytes:
        raise UploadRejected(
            f"{name}: the header declares {declared} bytes of data ({dtype} {tuple(shape)}), "
            f"the member holds {info.file_size - header_bytes}"
        )
    return tuple(shape), dtype


def check_npz(path: Path) -> int:
    """Rows of the NPZ at ``path`` (the checks of the module docstring)."""
    with _open(path) as zf:
        headers = {info.filename: _npy_header(zf, info) for info in zf.infolist()}
    if "x.npy" not in headers or "y.npy" not in headers:
        raise UploadRejected(f"expected arrays 'x' and 'y', got {sorted(headers)[:10]}")
    (xs, xd), (ys, yd) = headers["x.npy"], headers["y.npy"]
    if xd.kind not in "biuf" or not xs or math.prod(xs[1:]) == 0:
        raise UploadRejected(
            f"x: expected a real array of shape (N, ...) with at least one feature, got {xd} {xs}"
        )
    if yd.kind not in "iu" or len(ys) != 1 or ys[0] != xs[0]:
        raise UploadRejected(f"y: expected {xs[0]} integer labels of shape (N,), got {yd} {ys}")
    return xs[0]
