"""Resumable, verified downloads of a checkpoint file (RFC 9110 ranges, sha256 ETags).

The server sends every checkpoint with ``ETag: "sha256:<hex>"`` (the content hash) and honours
``Range`` with ``If-Range``. ``download_file``:

1. asks ``HEAD`` for the size and ETag;
2. if ``path`` already holds some bytes, asks only for the rest (``Range: bytes=<have>-`` and
   ``If-Range: <etag>``: a changed file comes back whole as a 200 and replaces the part); a
   complete file whose hash matches is not downloaded again;
3. on a dropped connection, resumes the same way up to ``retries`` times;
4. hashes the finished file and compares it with the ETag.

**A corrupted partial file** (bytes that are not a prefix of the server's file) cannot be
seen before the end: the final hash fails. If the download had resumed from such a part, the
part is discarded and the whole file downloaded once more from scratch (``restarted``); if a
download from scratch still does not match, the file is deleted and ``ChecksumMismatch`` is
raised.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import httpx

from client.errors import ChecksumMismatch, ComeraError

__all__ = ["DownloadResult", "download_file", "sha256_file"]

CHUNK = 1 << 20


@dataclass(frozen=True)
class DownloadResult:
    path: Path
    sha256: str
    size: int
    bytes_received: int  # over the network in this call (less than ``size`` when resumed)
    resumed_from: int  # bytes already on disk that were kept (0: downloaded from scratch)
    restarted: bool  # a partial file was discarded (corrupt, or the server's file changed)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _digest(etag: str) -> str:
    tag = etag.strip().removeprefix("W/").strip('"')
    if not tag.startswith("sha256:"):
        raise ComeraError(0, "No checksum", f"the server's ETag {etag!r} is not a sha256")
    return tag.removeprefix("sha256:")


def _head(http: httpx.Client, url: str) -> tuple[str, int]:
    r = http.head(url)
    if r.status_code >= 400:
        r = http.get(url, headers={"Range": "bytes=0-0"})  # HEAD has no body: get the problem
        raise ComeraError.from_response(r)
    return r.headers["etag"], int(r.headers["content-length"])


def _fetch(http: httpx.Client, url: str, path: Path, etag: str, size: int) -> tuple[int, bool]:
    """One GET from the current end of ``path``: (bytes received, whether the part was
    dropped because the server sent the whole file)."""
    have = path.stat().st_size if path.exists() else 0
    headers = {"Range": f"bytes={have}-", "If-Range": etag} if have else {}
    received, dropped = 0, False
    with http.stream("GET", url, headers=headers) as r:
        if r.status_code == 206:
            expected = f"bytes {have}-{size - 1}/{size}"
            if r.headers.get("content-range") != expected:
                raise ComeraError(
                    0,
                    "Bad range",
                    f"asked for bytes {have}- of {size}, got {r.headers.get('content-range')!r}",
                )
            mode = "ab"
        elif r.status_code == 200:
            mode, dropped = "wb", have > 0
            if r.headers.get("etag") != etag:
                raise ComeraError(0, "File changed", "the checkpoint changed during download")
        else:
            r.read()
            raise ComeraError.from_response(r)
        with path.open(mode) as f:
            for chunk in r.iter_bytes(CHUNK):
                f.write(chunk)
                received += len(chunk)
    return received, dropped


def download_file(
    http: httpx.Client,
    url: str,
    path: Path,
    *,
    retries: int = 3,
) -> DownloadResult:
    """Download ``url`` (a checkpoint ``content`` URL) to ``path``, resuming and verifying."""
    etag, size = _head(http, url)
    expected = _digest(etag)
    path.parent.mkdir(parents=True, exist_ok=True)
    have = path.stat().st_size if path.exists() else 0
    restarted = False
    if have > size or (have == size and sha256_file(path) != expected):
        path.unlink()  # longer than the file, or complete but wrong: not a usable prefix
        have, restarted = 0, True
    elif have == size:
        return DownloadResult(path, expected, size, 0, have, False)
    resumed_from, received, failures = have, 0, 0
    while True:
        try:
            got, dropped = _fetch(http, url, path, etag, size)
        except httpx.TransportError:
            failures += 1
            if failures > retries:
                raise
            continue
        received += got
        if dropped:
            resumed_from, restarted = 0, True
        if path.stat().st_size >= size:
            break
        failures += 1  # the server closed early without a transport error
        if failures > retries:
            raise ComeraError(
                0,
                "Incomplete download",
                f"{path}: {path.stat().st_size} of {size} bytes after {retries} retries",
            )
    actual = sha256_file(path)
    if actual == expected:
        return DownloadResult(path, actual, size, received, resumed_from, restarted)
    path.unlink()
    if resumed_from > 0:  # the kept prefix was corrupt: once more, from scratch
        again = download_file(http, url, path, retries=retries)
        return DownloadResult(path, again.sha256, size, received + again.bytes_received, 0, True)
    raise ChecksumMismatch(str(path), expected, actual)
