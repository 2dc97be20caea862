"""Resolving a path a user named (a dataset file, a model directory) under a server root.

``Path.resolve()`` follows symlinks; on a symlink loop (``ln -s loop loop``) Python 3.11 and
3.12 raise ``RuntimeError`` ("Symlink loop from '<absolute path>'"), later versions
``OSError`` (``ELOOP``). Callers catch ``OSError`` to turn what the file system refuses into a
422 naming the field: :func:`resolve` raises ``OSError(ELOOP)`` on every version, with a
reason that names no server path.
"""

from __future__ import annotations

import errno
from pathlib import Path

__all__ = ["LOOP", "reason", "resolve"]

LOOP = "a symlink loop"


def resolve(path: Path) -> Path:
    """``path.resolve()``; a symlink loop raises ``OSError(ELOOP, LOOP)``."""
    try:
        return path.resolve()
    except RuntimeError:  # Python < 3.13: a symlink loop
        raise OSError(errno.ELOOP, LOOP) from None


def reason(err: OSError | ValueError) -> str:
    """What the file system said, without the path (``str(err)`` names it)."""
    if isinstance(err, OSError):
        if err.errno == errno.ELOOP:
            return LOOP
        return err.strerror or errno.errorcode.get(err.errno or 0, "unreadable")
    return "a NUL character" if "null" in str(err) else "not a valid path"
