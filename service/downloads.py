"""Checkpoint downloads: one file, whole or one byte range (RFC 9110 section 14), with digests.

Headers on every answer: ``Accept-Ranges: bytes``, ``ETag: "sha256:<hex>"`` (a strong tag:
the content hash), ``Repr-Digest: sha-256=:<base64>:`` (RFC 9530; the digest of the whole
file, also on a 206), ``Content-Disposition`` and ``Content-Length``.

``Range`` forms: ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (the last ``n`` bytes) give
206 with ``Content-Range``; a range that starts past the end (or ``-0``) gives 416 with
``Content-Range: bytes */<size>``. A malformed or multi-range header is ignored (a full 200,
as RFC 9110 allows), and so is any ``Range`` whose ``If-Range`` does not equal the ETag.
A position of any length is read (one past 19 digits lies beyond every file: a first byte
there is a 416, a last byte or suffix length there means "to the end").
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException
from fastapi.responses import Response, StreamingResponse

from service.errors import problem_response
from service.store.db.models import Checkpoint
from service.store.settings import Settings
from service.store.storage import artifact_path, sha256_file

__all__ = [
    "ByteRange",
    "Unsatisfiable",
    "checkpoint_file",
    "file_response",
    "parse_range",
]

CHUNK = 1 << 20
_SPEC = re.compile(r"^(\d*)-(\d*)$")
BEYOND = 10**19  # more bytes than any file has: what a longer position reads as


class Unsatisfiable(Exception):
    """A syntactically valid range that selects no byte of the file (416)."""


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def _position(digits: str) -> int:
    """A byte position of the header; past 19 digits it is ``BEYOND`` (Python refuses to
    convert strings of more than 4,300 digits, and no file is that long anyway)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 19 else BEYOND


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The one range of ``header`` clipped to ``size``; None: serve the whole file."""
    if header is None or not header.strip().lower().startswith("bytes="):
        return None
    specs = header.strip()[6:].split(",")
    m = _SPEC.match(specs[0].strip()) if len(specs) == 1 else None
    if m is None or m[1] == m[2] == "":
        return None
    if m[1] == "":  # suffix: the last n bytes
        n = _position(m[2])
        if n == 0 or size == 0:
            raise Unsatisfiable
        return ByteRange(max(0, size - n), size - 1)
    start = _position(m[1])
    if m[2] and _position(m[2]) < start:
        return None  # invalid: ignored
    if start >= size:
        raise Unsatisfiable
    return ByteRange(start, min(_position(m[2]) if m[2] else size - 1, size - 1))


def checkpoint_file(settings: Settings, ckpt: Checkpoint) -> Path:
    """The file to serve (a directory checkpoint serves its weights file); 409 / 410."""
    if ckpt.state == "writing":
        raise HTTPException(409, "The checkpoint is still being written.")
    if ckpt.state == "deleted":
        raise HTTPException(410, "The checkpoint was deleted.")
    path = artifact_path(settings, ckpt.path)
    if path is not None and path.is_dir():
        weights = (ckpt.manifest or {}).get("weights", {})
        path = path / str(weights.get("file", "model.safetensors"))
    if path is None or not path.is_file():
        raise HTTPException(410, "The checkpoint file is gone.")
    return path


def _read(path: Path, start: int, length: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        f.seek(start)
        while length > 0:
            chunk = f.read(min(CHUNK, length))
            if not chunk:
                return
            length -= len(chunk)
            yield chunk


def file_response(
    *,
    path: Path,
    sha256: str | None,
    filename: str,
    head: bool,
    range_header: str | None,
    if_range: str | None,
) -> Response:
    """200 / 206 / 416 for ``path`` (HEAD: the same headers, no body)."""
    size = path.stat().st_size
    digest = sha256 or sha256_file(path)
    etag = f'"sha256:{digest}"'
    headers = {
        "Accept-Ranges": "bytes",
        "ETag": etag,
        "Repr-Digest": f"sha-256=:{base64.b64encode(bytes.fromhex(digest)).decode()}:",
        "Content-Disposition": f'attachment; filename="{filename}"',
    }
    if if_range is not None and if_range.strip() != etag:
        range_header = None  # the client's copy is stale: send the whole file
    try:
        rng = parse_range(range_header, size)
    except Unsatisfiable:
        headers["Content-Range"] = f"bytes */{size}"
        return problem_response(416, "The range selects no byte of the file.", headers=headers)
    status, start, length = 200, 0, size
    if rng is not None:
        status, start, length = 206, rng.start, rng.length
        headers["Content-Range"] = f"bytes {rng.start}-{rng.end}/{size}"
    headers["Content-Length"] = str(length)
    if head:
        return Response(status_code=status, headers=headers, media_type="application/octet-stream")
    return StreamingResponse(
        _read(path, start, length),
        status_code=status,
        headers=headers,
        media_type="application/octet-stream",
    )
