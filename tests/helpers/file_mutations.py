"""Hypothesis strategies that damage valid data files of every accepted format (pytest-free).

``damaged(fmt)`` draws a file of format ``fmt`` (``jsonl``, ``csv``, ``criteo``, ``text``,
``npz``): a small valid seed (:data:`SEEDS`) put through one to four edits:

* bytes: truncation, bit flips, overwritten / inserted / deleted / repeated slices, and
  splices of nasty tokens (NUL, a BOM, lone surrogates, CR, 5,000-digit integers, ``1e999``,
  3,000 nested brackets, broken UTF-8);
* lines (line formats): dropped, repeated, swapped, blanked; one tab- or comma-separated
  field replaced by a nasty token; a string of a row, or a whole line, replaced by a value
  nested 63 to 50,000 levels deep;
* NPZ: archives built member by member with lying ``.npy`` headers (shapes with huge,
  negative or zero dimensions, object / string / void / big-endian / datetime dtypes, Fortran
  order, data shorter or longer than declared, headers that are no dict), odd member lists
  (missing, extra, duplicated, not ``.npy``), then zip-level lies patched into both headers
  (encrypted and other flags, unknown methods, declared sizes up to 2**32 - 1, wrong CRCs,
  a corrupt deflate stream) and optionally byte edits on top.
"""

from __future__ import annotations

import csv
import io
import json
import struct
import warnings
import zipfile

import numpy as np
from hypothesis import strategies as st

from tests.helpers.hostile_files import corrupt_deflate, npy, patch_members

__all__ = ["FORMATS", "SEEDS", "damaged"]

FORMATS = ("jsonl", "csv", "criteo", "text", "npz")
_ROWS = [
    ("The cat sat on the mat.", "A cat sits.", "entailment"),
    ("Dogs bark loudly.", "Nothing barks.", "contradiction"),
    ("Rain fell all day.", "It was wet.", "neutral"),
    ('Quotes "inside", commas', "A tab\there", "entailment"),
    ("Ünïcödé wörds", "ascii", "neutral"),
    ("short", "x", "contradiction"),
]
_CRITEO = [
    "\t".join(["1", "3", "", "-2", *["7"] * 10, "a1b2", "", "FFFF0000", *["c0ffee"] * 23]),
    "\t".join(["0", *[""] * 13, *[""] * 26]),
    "\t".join(["1", *[str(i) for i in range(13)], *[f"{i:x}" for i in range(26)]]),
]


def _npz(deflated: bool, fortran: bool = False) -> bytes:
    buf = io.BytesIO()
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    x = np.asfortranarray(x) if fortran else x
    (np.savez_compressed if deflated else np.savez)(buf, x=x, y=np.arange(6) % 3)
    return buf.getvalue()


def _jsonl() -> bytes:
    rows = [{"premise": a, "hypothesis": b, "label": y} for a, b, y in _ROWS]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def _csv() -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["premise", "hypothesis", "label"])
    w.writerows(_ROWS)
    return buf.getvalue().encode()


SEEDS: dict[str, list[bytes]] = {
    "jsonl": [_jsonl()],
    "csv": [_csv()],
    "criteo": ["\n".join(_CRITEO * 2).encode() + b"\n"],
    "text": ["\n".join([*(a for a, _, _ in _ROWS), "", *(b for _, b, _ in _ROWS)]).encode()],
    "npz": [_npz(False), _npz(True), _npz(False, fortran=True)],
}
NASTY = [
    b"\x00",
    b"\xef\xbb\xbf",
    b"\xed\xa0\x80",  # a surrogate encoded in UTF-8: invalid
    b"\xff\xfe",
    b"\r",
    b"\n\n",
    b'"',
    b"\t",
    b",",
    b'"\\ud800"',
    b"9" * 5000,
    b"-" + b"9" * 30,
    b"1e999",
    b"NaN",
    b"[" * 3000,
    b'{"a":' * 1500,
    b"\\",
    "é\u2028".encode(),
]


@st.composite
def _byte_edit(draw: st.DrawFn, data: bytes) -> bytes:
    n = len(data)
    at = draw(st.integers(0, n))
    op = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete", "repeat"]))
    if op == "truncate":
        return data[:at]
    if op == "flip" and n:
        i = min(at, n - 1)
        return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
    if op == "overwrite":
        new = draw(st.one_of(st.binary(min_size=1, max_size=16), st.sampled_from(NASTY)))
        return data[:at] + new + data[at + len(new) :]
    if op == "insert":
        new = draw(st.one_of(st.binary(min_size=1, max_size=16), st.sampled_from(NASTY)))
        return data[:at] + new + data[at:]
    if op == "delete":
        return data[:at] + data[at + draw(st.integers(1, 64)) :]
    span = data[at : at + draw(st.integers(1, 64))]  # repeat
    return data[:at] + span * draw(st.integers(2, 64)) + data[at:]


@st.composite
def _line_edit(draw: st.DrawFn, data: bytes) -> bytes:
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    op = draw(st.sampled_from(["drop", "repeat", "swap", "blank"]))
    if op == "drop":
        del lines[i]
    elif op == "repeat":
        lines[i:i] = [lines[i]] * draw(st.integers(1, 300))
    elif op == "swap":
        j = draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines[i] = draw(st.sampled_from([b"", b" ", b"\r", b"\t" * 39]))
    return b"\n".join(lines)


@st.composite
def _nest(draw: st.DrawFn, data: bytes) -> bytes:
    """A value nested deep: in place of a string of a JSON row, or as a whole line."""
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    depth = draw(st.sampled_from([63, 64, 65, 1000, 3000, 50_000]))
    opening, closing = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    nested = opening * depth + b'"x"' + closing * depth
    quoted = [q for q in (b'"A cat sits."', b'"label"', b"entailment") if q in lines[i]]
    lines[i] = lines[i].replace(quoted[0], nested, 1) if quoted else nested
    return b"\n".join(lines)


@st.composite
def _field_edit(draw: st.DrawFn, data: bytes) -> bytes:
    """One tab- or comma-separated field of a line replaced by a nasty token."""
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    sep = b"\t" if b"\t" in lines[i] else b","
    fields = lines[i].split(sep)
    fields[draw(st.integers(0, len(fields) - 1))] = draw(st.sampled_from(NASTY))
    lines[i] = sep.join(fields)
    return b"\n".join(lines)


@st.composite
def _splice(draw: st.DrawFn, data: bytes) -> bytes:
    at = draw(st.integers(0, len(data)))
    return data[:at] + draw(st.sampled_from(NASTY)) + data[at:]


_DESCRS = ["<f4", "<f8", "<f2", ">f4", "<i8", "<i4", "|u1", "|i1", "|b1", "<u8", "<c8", "|O"]
_DESCRS += ["<U3", "|S2", "|V8", "<M8[s]", "<m8[D]", "[('a', '<f4')]"]


def _itemsize(descr: str) -> int:
    try:
        return np.dtype(descr).itemsize
    except TypeError:
        return 4


_ITEMSIZE = {d: _itemsize(d) for d in _DESCRS}
_DIM = st.one_of(
    st.integers(0, 8), st.sampled_from([-1, 10**6, 2**31, 2**32 - 1, 2**62, 2**63, 10**30])
)
_RAW_HEADERS = [  # .npy headers that are not the dict numpy writes
    b"[1, 2]",
    b"{'descr': '<f4', 'fortran_order': False}",
    b"{'descr': '<f4', 'fortran_order': 1, 'shape': (2,)}",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 2]}",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (True,)}",
    b"{'descr': 7, 'fortran_order': False, 'shape': (2,)}",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"(" * 300 + b")" * 300 + b",)}",
    b"__import__('os').system('false')",
]


@st.composite
def _member(draw: st.DrawFn, name: str) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        raw = draw(st.sampled_from(_RAW_HEADERS))
        raw += b" " * ((64 - (10 + len(raw) + 1) % 64) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + bytes(32)
    is_y = name.startswith("y")
    ndim = draw(st.integers(0, 4)) if draw(st.booleans()) else (1 if is_y else 2)
    shape = tuple(
        draw(_DIM) if draw(st.integers(0, 3)) == 0 else 4 if d else 6 for d in range(ndim)
    )
    descr = draw(st.sampled_from(["<i8"] if is_y and draw(st.booleans()) else _DESCRS))
    fortran = draw(st.booleans())
    fits = all(0 <= d <= 64 for d in shape)
    exact = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[descr] if fits else 0
    size = draw(st.one_of(st.just(exact), st.integers(0, 512)))
    data = draw(st.binary(min_size=size, max_size=size)) if size else b""
    return npy(shape, descr, fortran=fortran, data=data)


@st.composite
def _npz_built(draw: st.DrawFn) -> bytes:
    names = draw(
        st.one_of(
            st.just(["x.npy", "y.npy"]),
            st.lists(
                st.sampled_from(["x.npy", "y.npy", "z.npy", "x", "../x.npy", "X.NPY", "y.npy/"]),
                max_size=5,
            ),
        )
    )
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore", UserWarning)  # duplicate names are the point
        for name in names:
            method = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
            zf.writestr(zipfile.ZipInfo(name), draw(_member(name)), compress_type=method)
    return buf.getvalue()


@st.composite
def _zip_lie(draw: st.DrawFn, data: bytes) -> bytes:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except zipfile.BadZipFile:
        return data
    if not infos:
        return data
    op = draw(st.sampled_from(["flag", "method", "size", "crc", "deflate"]))
    if op == "flag":
        return patch_members(data, flag=draw(st.sampled_from([0x1, 0x8, 0x40, 0x800, 0x2000])))
    if op == "method":
        return patch_members(data, method=draw(st.sampled_from([1, 9, 12, 14, 93, 99])))
    info = draw(st.sampled_from(infos))
    if op == "deflate" and info.compress_type == zipfile.ZIP_DEFLATED:
        return corrupt_deflate(data, info.filename)
    out = bytearray(data)
    at = max(info.header_offset, 0)
    central = data.find(b"PK\x01\x02" + data[at + 4 : at + 6])
    spots = [info.header_offset + (14 if op == "crc" else 22)]
    if central >= 0:
        spots.append(central + (16 if op == "crc" else 24))
    value = draw(st.sampled_from([0, 1, 2**16, 2**31, 2**32 - 1]))
    for at in spots:
        if 0 <= at <= len(out) - 4:  # a zip edited before may place its headers anywhere
            struct.pack_into("<I", out, at, value)
    return bytes(out)


def damaged(fmt: str) -> st.SearchStrategy[bytes]:
    """A damaged file of format ``fmt`` (see the module docstring)."""
    seed = st.sampled_from(SEEDS[fmt])
    if fmt == "npz":
        seed = st.one_of(seed, _npz_built())
        edits = [_zip_lie, _byte_edit, _splice]
    else:
        edits = [_byte_edit, _line_edit, _field_edit, _nest, _splice]

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = draw(seed)
        for _ in range(draw(st.integers(0 if fmt == "npz" else 1, 4))):
            data = draw(draw(st.sampled_from(edits))(data))
        return data

    return build()
