"""Format checks of an uploaded dataset file, before it can be used by any job.

Each check streams the file once and either returns the number of rows or raises
``UploadRejected`` with a reason that names the line (or member) and what was expected:

* ``jsonl``: every non-blank line is a JSON object nested at most
  ``service.store.json_limits.MAX_DEPTH`` (64) levels deep;
* ``csv``: UTF-8, a header of at most ``MAX_COLUMNS`` columns, and every non-blank row has the
  header's number of columns (a field at most ``csv.field_size_limit()``, 128 KiB);
* ``criteo``: every line has 40 tab-separated fields: a 0/1 label, 13 integers of at most 19
  digits and 26 hex strings of 1-16 digits, the last two kinds possibly empty (the engine's
  own rule; a count past 64 bits is its ``DataError``);
* ``text``: UTF-8 with at least one non-blank line;
* ``npz``: :mod:`service.upload_npz` (only headers are read; nothing is ever unpickled).

Every line of the four line formats is at most ``MAX_LINE_BYTES`` (256 KiB before its
``\n``; CSV: characters): a longer one is refused with its number before the rest of it is
read. Eight times the longest sequence a job may ask for (8192 tokens), it bounds what the
worker's tokenizer spends on one line: about 520 bytes per character of a line of
punctuation (1 MiB of ``[`` took 523 MB), so 130 MB at most. Limits:
``docs/input-limits.md``.

No torch and no engine import here: the API process checks, the worker trusts.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from service.store import json_limits
from service.upload_errors import UploadRejected
from service.upload_npz import check_npz

__all__ = ["CHECKS", "MAX_COLUMNS", "MAX_LINE_BYTES", "UploadRejected", "check_format"]

N_DENSE, N_CATEGORICAL = 13, 26
N_FIELDS = 1 + N_DENSE + N_CATEGORICAL
# counts of at most 19 digits: the engine keeps them as 64-bit integers
_CRITEO = re.compile(
    rb"[01]" + rb"\t(?:-?[0-9]{1,19})?" * N_DENSE + rb"\t(?:[0-9a-fA-F]{1,16})?" * N_CATEGORICAL
)
_INT = re.compile(rb"-?[0-9]{1,19}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")
MAX_LINE_BYTES = 256 << 10
MAX_COLUMNS = 1024


def _too_long(n: int) -> UploadRejected:
    return UploadRejected(f"line {n}: longer than {MAX_LINE_BYTES} bytes")


def _bounded_lines(f: IO, n: int = 0) -> Iterator[tuple[int, bytes | str]]:
    """``(number, line with its terminator)`` of ``f`` (binary: bytes; text: characters),
    each read with a bounded ``readline``: a line longer than ``MAX_LINE_BYTES`` before its
    newline is refused before the rest of it is read."""
    newline = "\n" if isinstance(f, io.TextIOBase) else b"\n"
    while raw := f.readline(MAX_LINE_BYTES + 1):
        n += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(newline):
            raise _too_long(n)
        yield n, raw


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        for n, raw in _bounded_lines(f):
            yield n, raw.rstrip(b"\r\n")


def _check_jsonl(path: Path) -> int:
    rows = 0
    for n, line in _lines(path):
        if not line.strip():
            continue
        try:
            value = json_limits.loads(line)
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
            reader = csv.reader(line for _, line in _bounded_lines(f))
            header = next(reader, None)
            if not header or not any(h.strip() for h in header):
                raise UploadRejected("line 1: expected a header row")
            if len(header) > MAX_COLUMNS:
                raise UploadRejected(f"line 1: {len(header)} columns, at most {MAX_COLUMNS}")
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise UploadRejected(
                        f"line {reader.line_num}: {len(row)} columns, the header has {len(header)}"
                    )
                rows += 1
    except UnicodeDecodeError as err:
        raise UploadRejected(f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    except csv.Error as err:
        raise UploadRejected(f"not valid CSV ({err})") from None
    return rows


def _criteo_reason(line: bytes) -> str:
    fields = line.split(b"\t")
    if len(fields) != N_FIELDS:
        return (
            f"expected {N_FIELDS} tab-separated fields (label, {N_DENSE} integers, "
            f"{N_CATEGORICAL} hex categories), got {len(fields)}"
        )
    if fields[0] not in (b"0", b"1"):
        return f"expected label 0 or 1 in field 1, got {fields[0][:32]!r}"
    for j in range(1, 1 + N_DENSE):
        if fields[j] and not _INT.fullmatch(fields[j]):
            return f"expected an integer of at most 19 digits or an empty field in field {j + 1}"
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


def _longest_line(chunk: bytes, run: int) -> tuple[int, int, int]:
    """``(longest line seen, its index in the chunk, bytes of the line still open)``, for a
    chunk that continues a line of ``run`` bytes."""
    parts = chunk.split(b"\n")
    if len(parts) == 1:
        return run + len(chunk), 0, run + len(chunk)
    lengths = [run + len(parts[0]), *map(len, parts[1:-1])]
    longest = max(lengths)
    return longest, lengths.index(longest), len(parts[-1])


def _check_text(path: Path) -> int:
    """Lines of a UTF-8 file (0 when every line is blank)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    newlines = offset = run = 0
    nonblank, last = False, "\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            try:
                text = decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise UploadRejected(
                    f"not UTF-8 text (invalid byte at offset {offset + err.start})"
                ) from None
            longest, at, run = _longest_line(chunk, run)
            if longest > MAX_LINE_BYTES:
                raise _too_long(newlines + at + 1)
            offset += len(chunk)
            newlines += text.count("\n")
            nonblank = nonblank or bool(text.strip())
            last = text[-1:] or last
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise UploadRejected("not UTF-8 text (a truncated character at the end)") from None
    return 0 if not nonblank else newlines + (last != "\n")


CHECKS: dict[str, Callable[[Path], int]] = {
    "jsonl": _check_jsonl,
    "csv": _check_csv,
    "criteo": _check_criteo,
    "text": _check_text,
    "npz": check_npz,
}


def check_format(path: Path, fmt: str) -> int:
    """The number of rows of ``path`` read as ``fmt``; ``UploadRejected`` if malformed."""
    rows = CHECKS[fmt](path)
    if rows == 0:
        raise UploadRejected(f"the file holds no {fmt} rows")
    return rows
