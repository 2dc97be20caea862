"""Artifact files on local disk: paths stored in rows are relative to ``settings.artifacts``.

``artifact_path`` refuses anything that resolves outside the artifact directory (a row is
data the worker wrote; it must never make the API read or delete other files).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from service.core.config import Settings

__all__ = ["artifact_path", "remove_artifacts"]

log = logging.getLogger(__name__)


def artifact_path(settings: Settings, rel: str) -> Path | None:
    """The absolute path of ``rel`` under the artifact directory, or None if it escapes."""
    root = Path(settings.artifacts).resolve()
    path = (root / rel).resolve()
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
