"""Files of a job on the artifact store: where they go, their checksums, their catalogue rows.

Layout under ``settings.artifacts``::

    jobs/<job_id>/attempt-<n>/checkpoints/step-<step>.safetensors   training checkpoints
    jobs/<job_id>/attempt-<n>/checkpoints/final.safetensors         end of training
    jobs/<job_id>/attempt-<n>/export/{model.safetensors,manifest.json}   the compressed model
    jobs/<job_id>/attempt-<n>/export/{hf,dense}.tar   an ``hf`` job's Hugging Face directories

The engine writes every file atomically (temporary name, fsync, rename); the export directory
is written under a temporary name and renamed into place. A ``checkpoints`` row is created
only after its file is complete, with its size and sha256 (streamed,
docs/service.md#artifacts), so a
row in state ``complete`` always names a whole file; rows whose file the engine has since
rotated away become ``deleted``. Paths in rows are relative to the artifact directory.

``checkpointing.keep`` holds for the job, not per attempt: the engine rotates an attempt's own
checkpoints, and :func:`enforce_keep` deletes the older attempts' beyond the ``keep`` newest
(when an attempt starts and when the job succeeds).

An ``hf`` job's ``model/hf/`` (and ``model/dense/``) directories are served as one file each:
:func:`archive_dir` writes ``hf.tar`` (``dense.tar``) beside the export, members under
``hf/`` (``dense/``) in name order with fixed times and owners (the same directory gives the
same bytes), and removes the directory; its row has kind ``hf`` (``dense``) and format
``tar``.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from service.store.db.crud.checkpoints import complete_checkpoint, complete_checkpoints, path_shared
from service.store.db.crud.jobs import append_event
from service.store.db.models import Checkpoint, utcnow
from service.store.ids import new_id
from service.store.storage import sha256_file  # the API hashes downloads with the same function

if TYPE_CHECKING:
    from engine.export import ExportInfo

__all__ = [
    "RESUMABLE_KINDS",
    "archive_dir",
    "checkpoint_row",
    "enforce_keep",
    "export_rows",
    "find_checkpoint",
    "mark_deleted",
    "publish_dir",
    "relative",
    "retain",
    "sha256_file",
    "workdir",
]

RESUMABLE_KINDS = ("latest", "partial")


def workdir(artifacts: Path, job_id: str, attempt: int) -> Path:
    return artifacts / "jobs" / job_id / f"attempt-{attempt}"


def relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (POSIX form); raises ``ValueError`` if outside it."""
    return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not every platform opens directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(tmp: Path, final: Path) -> Path:
    """Rename the finished directory ``tmp`` to ``final`` (replacing a stale one) durably."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def archive_dir(directory: Path) -> Path:
    """``directory`` as ``<name>.tar`` beside it (module doc), written under a temporary name
    and renamed; the directory is then removed. Returns the tar's path."""
    final = directory.with_name(f"{directory.name}.tar")
    tmp = directory.with_name(f".{directory.name}.tar.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in [directory, *sorted(directory.rglob("*"))]:
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue  # the engine writes plain files only
            arcname = Path(directory.name, path.relative_to(directory)).as_posix()
            tar.add(path, arcname=arcname, recursive=False, filter=_reset)
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    shutil.rmtree(directory)
    _fsync_dir(final.parent)
    return final


def checkpoint_row(
    *,
    path: Path,
    artifacts: Path,
    job_id: str,
    tenant_id: str,
    attempt: int,
    kind: str,
    step: int,
    stage: str | None,
    metrics: dict[str, float],
    manifest: dict[str, Any] | None = None,
) -> Checkpoint:
    """A ``complete`` catalogue row for the finished file ``path`` (hashed now)."""
    return Checkpoint(
        id=new_id("ckpt"),
        job_id=job_id,
        tenant_id=tenant_id,
        attempt=attempt,
        kind=kind,
        step=step,
        stage=stage,
        metrics=dict(metrics),
        path=relative(path, artifacts),
        size_bytes=path.stat().st_size,
        sha256=sha256_file(path),
        format="safetensors",
        state="complete",
        manifest=manifest,
        created_at=utcnow(),
    )


def export_rows(
    info: ExportInfo,
    *,
    artifacts: Path,
    job_id: str,
    tenant_id: str,
    attempt: int,
    step: int,
    stage: str | None,
    metrics: dict[str, float],
) -> list[Checkpoint]:
    """The rows of a finished export: kind ``export`` for its weights (checked against the
    manifest's sha256; ``manifest["files"]`` gives the sizes and hashes of the weights and of
    ``manifest.json``), then kind ``hf`` and ``dense`` for the Hugging Face directories of an
    ``hf`` export, each archived to one tar (:func:`archive_dir`, format ``tar``)."""
    where = {"artifacts": artifacts, "job_id": job_id, "tenant_id": tenant_id, "attempt": attempt}
    row = checkpoint_row(
        path=info.weights_path, kind="export", step=step, stage=stage, metrics=metrics, **where
    )
    if row.sha256 != info.sha256:
        raise RuntimeError(f"the exported weights do not match their manifest ({row.sha256})")
    files = {
        info.weights_path.name: {"bytes": row.size_bytes, "sha256": row.sha256},
        info.manifest_path.name: {
            "bytes": info.manifest_path.stat().st_size,
            "sha256": sha256_file(info.manifest_path),
        },
    }
    row.manifest = {**info.manifest, "files": files}
    rows = [row]
    for kind in ("hf", "dense"):
        if not (info.path / kind).is_dir():
            continue
        extra = checkpoint_row(
            path=archive_dir(info.path / kind),
            kind=kind,
            step=row.step,
            stage=row.stage,
            metrics=row.metrics,
            **where,
        )
        extra.format = "tar"
        rows.append(extra)
    return rows


def mark_deleted(session: Session, *, job_id: str, tenant_id: str, artifacts: Path) -> list[str]:
    """Mark the job's complete training checkpoints whose files are gone as ``deleted``."""
    rows = complete_checkpoints(
        session=session, tenant_id=tenant_id, job_id=job_id, kinds=RESUMABLE_KINDS
    )
    gone = [r for r in rows if not (artifacts / r.path).is_file()]
    for r in gone:
        r.state = "deleted"
    return [r.id for r in gone]


def drop_partial(
    session: Session, *, job_id: str, tenant_id: str, attempt: int, artifacts: Path
) -> list[str]:
    """``save_partial: false``: delete this attempt's partial checkpoints (files and rows
    marked ``deleted``); returns their ids."""
    rows = complete_checkpoints(
        session=session, tenant_id=tenant_id, job_id=job_id, kinds=("partial",), attempt=attempt
    )
    for r in rows:
        r.state = "deleted"
        if not path_shared(  # a stop right at a periodic checkpoint rewrote its file
            session=session, tenant_id=tenant_id, job_id=job_id, path=r.path, other_than=r.id
        ):
            (artifacts / r.path).unlink(missing_ok=True)
    return [r.id for r in rows]


def _resumable_newest_first(session: Session, *, tenant_id: str, job_id: str) -> list[Checkpoint]:
    """The job's complete resumable checkpoints (``latest``, ``partial``) of any attempt,
    newest first."""
    return complete_checkpoints(
        session=session,
        tenant_id=tenant_id,
        job_id=job_id,
        kinds=RESUMABLE_KINDS,
        newest_first=True,
    )


def enforce_keep(
    session: Session,
    *,
    job_id: str,
    tenant_id: str,
    artifacts: Path,
    keep: int,
    protect: tuple[str, ...] = (),
) -> list[str]:
    """Keep the ``keep`` newest complete resumable checkpoints of the job, of any attempt (and
    those in ``protect``); delete the files of the rest and mark their rows ``deleted``.
    Returns the ids deleted, oldest first. Final checkpoints and exports are not touched."""
    rows = _resumable_newest_first(session, tenant_id=tenant_id, job_id=job_id)
    old = [r for r in rows[keep:] if r.id not in protect]
    kept_paths = {r.path for r in rows if r not in old}
    for r in reversed(old):
        r.state = "deleted"
        if r.path not in kept_paths:  # a partial written at a periodic step shares its file
            (artifacts / r.path).unlink(missing_ok=True)
    return [r.id for r in reversed(old)]


def retain(
    session: Session,
    *,
    job_id: str,
    tenant_id: str,
    attempt: int,
    artifacts: Path,
    keep: int,
    protect: tuple[str, ...] = (),
) -> None:
    """:func:`enforce_keep`, with a ``checkpoint`` event (state ``deleted``, reason
    ``checkpointing.keep``) for each checkpoint it deleted."""
    deleted = enforce_keep(
        session,
        job_id=job_id,
        tenant_id=tenant_id,
        artifacts=artifacts,
        keep=keep,
        protect=protect,
    )
    log_deleted(session, job_id=job_id, attempt=attempt, ids=deleted, reason="checkpointing.keep")


def log_deleted(
    session: Session, *, job_id: str, attempt: int, ids: list[str], reason: str
) -> None:
    """A ``checkpoint`` event (state ``deleted``, ``reason``) for each checkpoint of ``ids``."""
    for cid in ids:
        data = {"id": cid, "state": "deleted", "reason": reason}
        append_event(session=session, job_id=job_id, attempt=attempt, kind="checkpoint", data=data)


def _usable(row: Checkpoint, artifacts: Path) -> bool:
    path = artifacts / row.path
    return (
        path.is_file() and path.stat().st_size == row.size_bytes and sha256_file(path) == row.sha256
    )


def find_checkpoint(
    session: Session,
    *,
    job_id: str,
    tenant_id: str,
    artifacts: Path,
    checkpoint_id: str | None = None,
) -> Checkpoint | None:
    """The checkpoint to resume from: ``checkpoint_id`` (None if it is not a complete,
    resumable checkpoint of this job whose file is intact), or else the newest complete
    ``latest``/``partial`` checkpoint of any attempt whose file is intact."""
    if checkpoint_id is not None:
        row = complete_checkpoint(
            session=session,
            tenant_id=tenant_id,
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            kinds=(*RESUMABLE_KINDS, "final"),
        )
        return row if row is not None and _usable(row, artifacts) else None
    newest = _resumable_newest_first(session, tenant_id=tenant_id, job_id=job_id)
    for row in newest:
        if _usable(row, artifacts):
            return row
    return None
