"""The compression report (``GET /v1/jobs/{id}/report``) and checkpoint manifests.

The report is measured on the saved artifact: ``file_bytes`` is the size of the exported
weights file on disk now, ``dense_bytes`` the dense-equivalent bytes the engine recorded in
the export manifest (the same model with every tensorized layer dense, at the same element
sizes), and ``file_ratio`` their quotient. Parameter counts and the per-layer rows come from
the manifest (``engine.export``: ``totals`` and ``layers``). ``metrics`` are the export's
(the final validation metrics). ``fidelity`` (``hf_bert``) is what the worker measured on
the reloaded export against the original model (``engine.train.fidelity``), kept
in the export row's manifest. ``baseline`` is the dense baseline of :mod:`service.baseline`
(same tenant, same spec, method ``dense``, newest SUCCEEDED): its export's metrics and the
deltas ``this job - baseline`` per shared metric; null when there is none.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException
from sqlalchemy.orm import Session

from api_schemas import CheckpointFile, CheckpointManifestPublic, CompressionReport, LayerReport
from api_schemas.artifacts import BaselineReport, DeployReport, FidelityReport
from service.baseline import find_baseline, metric_deltas
from service.downloads import checkpoint_file
from service.store.db.crud.checkpoints import newest_export, stage_events
from service.store.db.models import Checkpoint, Job
from service.store.settings import Settings
from service.store.storage import artifact_path, sha256_file

__all__ = ["checkpoint_manifest", "compression_report"]

MANIFEST_FILE = "manifest.json"


def _stored_manifest(settings: Settings, ckpt: Checkpoint) -> dict[str, Any] | None:
    """The row's manifest, else ``manifest.json`` of a directory checkpoint."""
    if ckpt.manifest:
        return dict(ckpt.manifest)
    path = artifact_path(settings, ckpt.path)
    if path is not None and (path / MANIFEST_FILE).is_file():
        try:
            data = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
    return None


def _layer(rec: dict[str, Any]) -> LayerReport:
    if rec.get("kind") == "ttm_embedding":
        modes = {"rows": rec.get("row_modes"), "cols": rec.get("col_modes")}
    else:
        modes = {"in": rec.get("in_modes"), "out": rec.get("out_modes")}
    params, dense = int(rec.get("params", 0)), int(rec.get("dense_params", 0))
    return LayerReport(
        name=rec["name"],
        kind=rec.get("kind", "?"),
        modes=modes,
        ranks=rec.get("ranks", []),
        dense_params=dense,
        params=params,
        ratio=dense / params if params else None,
    )


def _metrics(manifest: dict[str, Any] | None, ckpt: Checkpoint) -> dict[str, float]:
    """An export's metrics: the manifest's, else the checkpoint row's."""
    return dict((manifest or {}).get("metrics") or ckpt.metrics or {})


def _fidelity(manifest: dict[str, Any]) -> FidelityReport | None:
    found = (manifest.get("report") or {}).get("fidelity")
    return FidelityReport.model_validate(found) if isinstance(found, dict) else None


def _deploy(manifest: dict[str, Any]) -> DeployReport | None:
    """``hf`` jobs: the deployment table the worker measured (the engine report's
    ``hf_export.deploy``, stored as the export manifest's ``report.deploy``)."""
    found = (manifest.get("report") or {}).get("deploy")
    return DeployReport.model_validate(found) if isinstance(found, dict) else None


def _baseline(
    session: Session, settings: Settings, job: Job, metrics: dict[str, float]
) -> BaselineReport | None:
    found = find_baseline(session=session, job=job)
    if found is None:
        return None
    base, export = found
    base_metrics = _metrics(_stored_manifest(settings, export), export)
    return BaselineReport(
        job_id=base.id, metrics=base_metrics, deltas=metric_deltas(metrics, base_metrics)
    )


def compression_report(*, session: Session, settings: Settings, job: Job) -> CompressionReport:
    """409 until the job has a complete export checkpoint with a manifest."""
    ckpt = newest_export(session=session, tenant_id=job.tenant_id, job_id=job.id)
    manifest = _stored_manifest(settings, ckpt) if ckpt is not None else None
    if ckpt is None or manifest is None:
        raise HTTPException(409, "No compressed export yet: the report needs the job's export.")
    file_bytes = checkpoint_file(settings, ckpt).stat().st_size
    totals, weights = manifest.get("totals", {}), manifest.get("weights", {})
    params = int(totals.get("stored_params", 0))
    params_dense = int(totals.get("dense_equivalent_params", params))
    dense_bytes = int(weights.get("dense_equivalent_bytes") or 4 * params_dense)
    extra = manifest.get("extra") or {}  # what the worker added to the export's manifest
    stages = extra.get("stages") or stage_events(
        session=session, tenant_id=job.tenant_id, job_id=job.id
    )
    metrics = _metrics(manifest, ckpt)
    return CompressionReport(
        job_id=job.id,
        checkpoint_id=ckpt.id,
        file_bytes=file_bytes,
        dense_bytes=dense_bytes,
        file_ratio=dense_bytes / file_bytes if file_bytes else 0.0,
        params=params,
        params_dense=params_dense,
        tensorized_ratio=totals.get("tensorized_ratio"),
        model_ratio=totals.get("model_ratio"),
        layers=[_layer(r) for r in manifest.get("layers", [])],
        metrics=metrics,
        stages=stages,
        engine_version=manifest.get("engine_version") or job.engine_version,
        spec_hash=job.spec_hash,
        fidelity=_fidelity(manifest),
        deploy=_deploy(manifest),
        baseline=_baseline(session, settings, job, metrics),
        execution=extra.get("execution"),
        target=extra.get("target"),
        chance=extra.get("chance"),
        auto_rank=extra.get("auto_rank"),
        advice=extra.get("advice"),
    )


def checkpoint_manifest(*, settings: Settings, ckpt: Checkpoint) -> CheckpointManifestPublic:
    """One sha256 per file of the checkpoint, and the engine manifest when there is one."""
    content = checkpoint_file(settings, ckpt)  # 409 / 410 as for the content
    manifest = _stored_manifest(settings, ckpt)
    files = [
        CheckpointFile(
            name=content.name,
            size_bytes=content.stat().st_size,
            sha256=ckpt.sha256 or sha256_file(content),
        )
    ]
    folder = artifact_path(settings, ckpt.path)
    side = None if folder is None or not folder.is_dir() else folder / MANIFEST_FILE
    if side is not None and side.is_file():
        files.append(
            CheckpointFile(
                name=MANIFEST_FILE, size_bytes=side.stat().st_size, sha256=sha256_file(side)
            )
        )
    return CheckpointManifestPublic(
        checkpoint_id=ckpt.id, kind=ckpt.kind, files=files, manifest=manifest
    )
