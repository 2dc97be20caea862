"""An on-disk cache of the sentence pools parsed from installed source files.

Cutting the standard library's docstrings into sentences parses ~1,000 files (7 s on one
core); with ``packages`` such as torch or sympy, ~30 s. Every process that builds a job's
data paid it again: each worker attempt, each planner child, each test process. A pool is a
pure function of its inputs, so it is kept as JSON and read back while they are unchanged:

* the files it was parsed from (path, size and modification time of each);
* the code that cuts them (the bytes of the modules named by ``code``);
* the interpreter (``sys.version``) and the pool's own parameters (``key``).

A change to any of them is another file name, so nothing is ever invalidated in place; the
directory keeps the :data:`MAX_ENTRIES` pools used last (a read touches its file) and drops
the rest when it writes. It is ``COMERA_TEXT_CACHE`` if set (``off`` turns the cache off),
else ``$XDG_CACHE_HOME/comera/text`` (``~/.cache/comera/text``). A file is written whole
under a temporary name and renamed into place, so concurrent writers and readers see a whole
file or none; a cache that cannot be read or written is passed over, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "cache_dir", "cached_pool"]

CACHE_ENV = "COMERA_TEXT_CACHE"
MAX_ENTRIES = 32  # pools kept (the standard library's: ~0.8 MB; torch's docstrings: a few MB)
_FORMAT = 1  # bump when the file layout below changes
_ENTRY = re.compile(r"[a-z][a-z0-9-]*-[0-9a-f]{40}\.json")  # a pool's file name


def cache_dir() -> Path | None:
    """Where pools are kept, or ``None`` when the cache is off."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "comera" / "text"


def _digest(key: Mapping[str, Any], files: Iterable[Path], code: Sequence[Path]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([_FORMAT, sys.version, dict(key)], sort_keys=True).encode())
    for path in code:
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    for path in files:
        try:
            st = path.stat()
            stamp = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n"
        except OSError:
            stamp = f"{path}\0missing\n"
        h.update(stamp.encode())
    return h.hexdigest()


def cached_pool(
    name: str,
    key: Mapping[str, Any],
    files: Sequence[Path],
    code: Sequence[Path],
    build: Callable[[], Sequence[Any]],
) -> tuple[Any, ...]:
    """``build()`` as a tuple, from the cache when ``name``'s entry for these inputs exists
    (module doc). Entries are strings or lists of strings (read back as tuples)."""
    directory = cache_dir()
    if directory is None:
        return tuple(build())
    path = directory / f"{name}-{_digest(key, files, code)[:40]}.json"
    try:
        items = json.loads(path.read_text(encoding="utf-8"))["pool"]
        pool = tuple(tuple(x) if isinstance(x, list) else x for x in items)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: build it
    else:
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be dropped
        return pool
    pool = tuple(build())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"name": name, "pool": pool}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk: the pool is still returned
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    else:
        _prune(directory)
    return pool


def _prune(directory: Path) -> None:
    """Drop all but the :data:`MAX_ENTRIES` pools of ``directory`` modified last (only files
    named as :func:`cached_pool` names them: the directory may hold others)."""
    stamped = []
    for entry in directory.glob("*.json"):
        if not _ENTRY.fullmatch(entry.name):
            continue
        with contextlib.suppress(OSError):
            stamped.append((entry.stat().st_mtime_ns, entry))
    stamped.sort(reverse=True)
    for _, old in stamped[MAX_ENTRIES:]:
        with contextlib.suppress(OSError):
            old.unlink()
