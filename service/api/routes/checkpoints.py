"""``/v1/jobs/{id}/checkpoints`` (list, content, manifest) and ``/v1/jobs/{id}/report``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request, Response

from api_schemas import CheckpointManifestPublic, CheckpointsPublic, CompressionReport
from service.api.deps import ArtifactsDep, JobDep, SessionDep, SettingsDep
from service.downloads import checkpoint_file, file_response
from service.errors import problems
from service.reports import checkpoint_manifest, compression_report
from service.store.db.crud.checkpoints import get_checkpoint, list_checkpoints
from service.store.db.models import Checkpoint
from service.views import checkpoint_public

# checkpoints, their content and the report are artifacts: ``artifacts:read`` on top of the
# method's scope
router = APIRouter(prefix="/jobs/{job_id}", tags=["checkpoints"], dependencies=[ArtifactsDep])
CONTENT_RESPONSES = {
    200: {"content": {"application/octet-stream": {}}, "description": "The whole file"},
    206: {"content": {"application/octet-stream": {}}, "description": "One byte range"},
    **problems(404, 409, 410, 416),
}


def _checkpoint(session: SessionDep, job: JobDep, checkpoint_id: str) -> Checkpoint:
    ckpt = get_checkpoint(
        session=session, tenant_id=job.tenant_id, job_id=job.id, checkpoint_id=checkpoint_id
    )
    if ckpt is None:
        raise HTTPException(404, "Checkpoint not found.")
    return ckpt


@router.get("/checkpoints", response_model=CheckpointsPublic, responses=problems(404))
def list_checkpoints_route(job: JobDep, session: SessionDep) -> CheckpointsPublic:
    """Every checkpoint of the job, oldest first (``state``: writing, complete, deleted)."""
    items = list_checkpoints(session=session, tenant_id=job.tenant_id, job_id=job.id)
    return CheckpointsPublic(items=[checkpoint_public(c) for c in items])


@router.head(
    "/checkpoints/{checkpoint_id}/content", response_class=Response, responses=CONTENT_RESPONSES
)
@router.get(
    "/checkpoints/{checkpoint_id}/content", response_class=Response, responses=CONTENT_RESPONSES
)
def checkpoint_content(
    job: JobDep,
    checkpoint_id: str,
    session: SessionDep,
    settings: SettingsDep,
    request: Request,
    range_: Annotated[str | None, Header(alias="Range")] = None,
    if_range: Annotated[str | None, Header()] = None,
) -> Response:
    """The checkpoint file; ``Range`` gives 206, with ``If-Range`` honoured."""
    ckpt = _checkpoint(session, job, checkpoint_id)
    path = checkpoint_file(settings, ckpt)
    sha = ckpt.sha256 or (ckpt.manifest or {}).get("weights", {}).get("sha256")
    session.close()  # no connection held while the file streams
    return file_response(
        path=path,
        sha256=sha,
        filename=f"{ckpt.id}.{ckpt.format}",
        head=request.method == "HEAD",
        range_header=range_,
        if_range=if_range,
    )


@router.get(
    "/checkpoints/{checkpoint_id}/manifest",
    response_model=CheckpointManifestPublic,
    responses=problems(404, 409, 410),
)
def read_manifest(
    job: JobDep, checkpoint_id: str, session: SessionDep, settings: SettingsDep
) -> CheckpointManifestPublic:
    """One sha256 per file, and the engine manifest of an export."""
    ckpt = _checkpoint(session, job, checkpoint_id)
    return checkpoint_manifest(settings=settings, ckpt=ckpt)


@router.get("/report", response_model=CompressionReport, responses=problems(404, 409, 410))
def read_report(job: JobDep, session: SessionDep, settings: SettingsDep) -> CompressionReport:
    """Compression measured on the exported file: bytes, parameters, per-layer ranks, metrics
    and the dense baseline; 409 until the job has exported its model."""
    return compression_report(session=session, settings=settings, job=job)
