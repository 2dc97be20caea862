"""Format checks of an uploaded dataset file, before it can be used by any job.

Each check streams the file once and either returns the number of rows or raises
``UploadRejected`` with a reason that names the line (or member) and what was expected:

* ``jsonl``: every non-blank line is a JSON object;
* ``csv``: UTF-8, a header, and every non-blank row has the header's number of columns;
* ``criteo``: every line has 40 tab-separated fields: a 0/1 label, 13 integers and 26 hex
  strings of 1-16 digits, the last two kinds possibly empty (the engine's own rule);
* ``text``: UTF-8 with at least one non-blank line;
* ``npz``: a zip of ``.npy`` members whose headers parse with ``numpy.lib.format`` and whose
  dtype holds no Python objects, including ``x`` (N, ...) real and ``y`` (N,) integer arrays,
  as the MLP loader reads them. Only headers are read; nothing is ever unpickled.

No torch and no engine import here: the API process checks, the worker trusts.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

__all__ = ["CHECKS", "UploadRejected", "check_format"]

N_DENSE, N_CATEGORICAL = 13, 26
N_FIELDS = 1 + N_DENSE + N_CATEGORICAL
_CRITEO = re.compile(rb"[01]" + rb"\t(?:-?[0-9]+)?" * N_DENSE
                     + rb"\t(?:[0-9a-fA-F]{1,16})?" * N_CATEGORICAL)  # fmt: skip
_INT = re.compile(rb"-?[0-9]+")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")
MAX_MEMBERS = 1000


class UploadRejected(ValueError):
    """The file is not what its declared format says; the message says why and where."""


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            yield n, raw.rstrip(b"\r\n")


def _check_jsonl(path: Path) -> int:
    rows = 0
    for n, line in _lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as err:
            raise UploadRejected(f"line {n}: not valid JSON ({err})") from None
        if not isinstance(value, dict):
            raise UploadRejected(f"line {n}: expected a JSON object, got {type(value).__name__}")
        rows += 1
    return rows


def _check_csv(path: Path) -> int:
    rows = 0
    try:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header or not any(h.strip() for h in header):
                raise UploadRejected("line 1: expected a header row")
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise UploadRejected(f"line {reader.line_num}: {len(row)} columns, the "
                                         f"header has {len(header)}")  # fmt: skip
                rows += 1
    except UnicodeDecodeError as err:
        raise UploadRejected(f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    except csv.Error as err:
        raise UploadRejected(f"not valid CSV ({err})") from None
    return rows


def _criteo_reason(line: bytes) -> str:
    fields = line.split(b"\t")
    if len(fields) != N_FIELDS:
        return (f"expected {N_FIELDS} tab-separated fields (label, {N_DENSE} integers, "
                f"{N_CATEGORICAL} hex categories), got {len(fields)}")  # fmt: skip
    if fields[0] not in (b"0", b"1"):
        return f"expected label 0 or 1 in field 1, got {fields[0][:32]!r}"
    for j in range(1, 1 + N_DENSE):
        if fields[j] and not _INT.fullmatch(fields[j]):
            return f"expected an integer or an empty field in field {j + 1}"
    for j in range(1 + N_DENSE, N_FIELDS):
        if fields[j] and not _HEX.fullmatch(fields[j]):
            return f"expected a hex string of 1-16 digits or an empty field in field {j + 1}"
    return "expected a Criteo TSV line"


def _check_criteo(path: Path) -> int:
    rows = 0
    for n, line in _lines(path):
        if not _CRITEO.fullmatch(line):
            raise UploadRejected(f"line {n}: {_criteo_reason(line)}")
        rows += 1
    return rows


def _check_text(path: Path) -> int:
    """Lines of a UTF-8 file (0 when every line is blank)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    newlines = offset = 0
    nonblank, last = False, "\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            try:
                text = decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise UploadRejected(f"not UTF-8 text (invalid byte at offset "
                                     f"{offset + err.start})") from None  # fmt: skip
            offset += len(chunk)
            newlines += text.count("\n")
            nonblank = nonblank or bool(text.strip())
            last = text[-1:] or last
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise UploadRejected("not UTF-8 text (a truncated character at the end)") from None
    return 0 if not nonblank else newlines + (last != "\n")


def _npy_header(zf: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    with zf.open(name) as f:
        try:
            major, _ = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if major == 1
                    else np.lib.format.read_array_header_2_0)  # fmt: skip
            shape, _fortran, dtype = read(f)
        except ValueError as err:
            raise UploadRejected(f"{name}: not a .npy array ({err})") from None
    if dtype.hasobject:
        raise UploadRejected(f"{name}: dtype {dtype} holds Python objects (pickles are refused)")
    return tuple(shape), dtype


def _check_npz(path: Path) -> int:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise UploadRejected(f"not an .npz (zip) archive ({err})") from None
    with zf:
        names = zf.namelist()
        bad = [n for n in names if not n.endswith(".npy")]
        if len(names) > MAX_MEMBERS or bad:
            raise UploadRejected(f"expected only .npy members (at most {MAX_MEMBERS}), got "
                                 f"{(bad or names)[:5]}")  # fmt: skip
        headers = {n: _npy_header(zf, n) for n in names}
    if "x.npy" not in headers or "y.npy" not in headers:
        raise UploadRejected(f"expected arrays 'x' and 'y', got {sorted(headers)[:10]}")
    (xs, xd), (ys, yd) = headers["x.npy"], headers["y.npy"]
    if xd.kind not in "biuf" or not xs:
        raise UploadRejected(f"x: expected a real array of shape (N, ...), got {xd} {xs}")
    if yd.kind not in "iu" or len(ys) != 1 or ys[0] != xs[0]:
        raise UploadRejected(f"y: expected {xs[0]} integer labels of shape (N,), got {yd} {ys}")
    return int(xs[0])


CHECKS: dict[str, Callable[[Path], int]] = {
    "jsonl": _check_jsonl, "csv": _check_csv, "criteo": _check_criteo, "text": _check_text,
    "npz": _check_npz,
}  # fmt: skip


def check_format(path: Path, fmt: str) -> int:
    """The number of rows of ``path`` read as ``fmt``; ``UploadRejected`` if malformed."""
    rows = CHECKS[fmt](path)
    if rows == 0:
        raise UploadRejected(f"the file holds no {fmt} rows")
    return rows
