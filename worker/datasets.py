"""From a job's dataset reference to files the engine may read.

* ``synthetic``: no files; the engine generates the data.
* ``upload``: a ``datasets`` row of the job's own tenant in state ``ready``; its file lives
  under the artifact directory.
* ``path``: a file under the server's data root (``settings.data``). The path is resolved
  (symlinks followed) and must stay inside the root and name an existing file: a user can
  never make a worker read ``/etc/passwd`` or another tenant's upload.

Anything that does not resolve raises :class:`api_schemas.engine_spec.SpecError` with the JSON
Pointer of the failing field, so the job fails as a validation error that names it.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from api_schemas import DatasetSpec
from api_schemas.engine_spec import SpecError
from service.store import paths
from service.store.db.models import Dataset
from service.store.settings import Settings

__all__ = ["inside", "resolve_dataset"]


def inside(root: Path, rel: str, pointer: str, what: str = "the data root") -> Path:
    """``root / rel`` resolved; must be an existing file inside ``root`` (else SpecError)."""
    base = Path(root).resolve()
    if Path(rel).is_absolute() or ".." in Path(rel).parts or "\x00" in rel:
        raise SpecError(pointer, f"must be a relative path under {what}, without '..'")
    try:  # a symlink loop, a name too long: the user's path, not the worker's failure
        path = paths.resolve(base / rel)
        if not path.is_relative_to(base):
            raise SpecError(pointer, f"resolves outside {what} (a symlink may not leave it)")
        found = path.is_file()
    except OSError as err:
        raise SpecError(pointer, f"cannot read {rel[:200]!r}: {paths.reason(err)}") from None
    if not found:
        raise SpecError(pointer, f"no such file under {what}: {rel!r}")
    return path


def resolve_dataset(
    *, session: Session, settings: Settings, tenant_id: str, spec: DatasetSpec
) -> tuple[str | None, str | None]:
    """``(train_path, valid_path)`` as absolute paths (``None`` for what is not a file)."""
    if spec.source == "synthetic":
        return None, None
    if spec.source == "upload":
        row = session.scalars(
            select(Dataset).where(
                Dataset.id == spec.dataset_id,
                Dataset.tenant_id == tenant_id,
                Dataset.state == "ready",
            )
        ).first()
        if row is None:
            raise SpecError("/dataset/dataset_id", f"no ready dataset {spec.dataset_id!r}")
        if spec.format is not None and row.format != spec.format:
            raise SpecError(
                "/dataset/format", f"dataset {row.id} is {row.format!r}, not {spec.format!r}"
            )
        return str(
            inside(settings.artifacts, row.path, "/dataset/dataset_id", "the artifact store")
        ), None
    assert spec.path is not None  # DatasetSpec requires it for source "path"
    train = inside(settings.data, spec.path, "/dataset/path")
    valid = None
    if spec.valid_path is not None:
        valid = inside(settings.data, spec.valid_path, "/dataset/valid_path")
    return str(train), None if valid is None else str(valid)
