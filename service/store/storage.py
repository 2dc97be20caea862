"""Artifact files on local disk: paths stored in rows are relative to ``settings.artifacts``.

``artifact_path`` refuses anything that resolves outside the artifact directory (a row is
data the worker wrote; it must never make the API read or delete other files).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from service.store import paths
from service.store.settings import Settings

__all__ = ["artifact_path", "remove_artifacts", "sha256_file"]

log = logging.getLogger(__name__)


def artifact_path(settings: Settings, rel: str) -> Path | None:
    """The absolute path of ``rel`` under the artifact directory, or None if it escapes."""
    root = Path(settings.artifacts).resolve()
    try:
        path = paths.resolve(root / rel)
    except (OSError, ValueError):  # a symlink loop, a name too long: no file to serve
        return None
    return path if path.is_relative_to(root) and path != root else None


def remove_artifacts(settings: Settings, job_id: str, rels: Iterable[str]) -> None:
    """Delete the files / directories of a job's checkpoints and its ``jobs/<id>`` folder."""
    for rel in [*rels, f"jobs/{job_id}"]:
        path = artifact_path(settings, rel)
        if path is None or not path.exists():
            continue
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            log.exception("could not delete artifact %s", path)


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks (the API's ETags and the worker's rows)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
