"""The compression report of a finished job, measured on the exported file.

Shaped like ``api_schemas.CompressionReport``. It is stored in the export checkpoint's
``manifest["report"]`` (the API serves it from there); a summary without the per-layer and
per-stage lists goes into ``jobs.compression``. The sizes come from the export manifest,
which the engine computed from the bytes it wrote; the sha256 was checked against the file.
``fidelity`` (``hf_bert`` jobs) is the exported model's agreement with the original on the
held-out sentences (``engine.train.fidelity``); ``target`` says whether the last
size target was reached (the fidelity guard may stop a late stage short of it, and why);
``chance`` whether the final accuracy is no better than the majority class or uniform
guessing; ``baseline`` is filled in by the API when the report is read (``service.baseline``).
"""

from __future__ import annotations

from typing import Any

from worker.recorder import finite

__all__ = [
    "chance_summary",
    "compression_report",
    "compression_summary",
    "success_message",
    "target_summary",
    "val_metrics",
]


def val_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The engine's validation metrics (``loss``, ...) under the job's keys (``val_loss``)."""
    return {f"val_{k}": float(v) for k, v in metrics.items() if finite(v)}


def _layer(rec: dict[str, Any]) -> dict[str, Any]:
    if rec["kind"] == "tt_linear":
        modes = {"in": rec.get("in_modes"), "out": rec.get("out_modes")}
    else:
        modes = {"rows": rec.get("row_modes"), "cols": rec.get("col_modes")}
    return {
        "name": rec["name"],
        "kind": rec["kind"],
        "modes": modes,
        "ranks": rec["ranks"],
        "dense_params": rec["dense_params"],
        "params": rec["params"],
        "ratio": rec["ratio"],
    }


def compression_report(
    *,
    job_id: str,
    checkpoint_id: str,
    manifest: dict[str, Any],
    stages: list[dict[str, Any]],
    metrics: dict[str, float],
    spec_hash: str,
    fidelity: dict[str, Any] | None = None,
    target: dict[str, Any] | None = None,
    chance: dict[str, Any] | None = None,
    deploy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    totals, weights = manifest["totals"], manifest["weights"]
    return {
        "job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "file_bytes": weights["bytes"],
        "dense_bytes": weights["dense_equivalent_bytes"],
        "file_ratio": weights["file_ratio"],
        "params": totals["stored_params"],
        "params_dense": totals["dense_equivalent_params"],
        "tensorized_ratio": totals["tensorized_ratio"],
        "model_ratio": totals["model_ratio"],
        "layers": [_layer(r) for r in manifest["layers"]],
        "metrics": metrics,
        "stages": stages,
        "engine_version": manifest.get("engine_version"),
        "spec_hash": spec_hash,
        "fidelity": fidelity,
        "target": target,
        "chance": chance,
        "deploy": deploy,
        "baseline": None,
    }


def compression_summary(report: dict[str, Any]) -> dict[str, Any]:
    """``jobs.compression`` at the end: current ratio and parameters, file sizes, report id."""
    return {
        "current_ratio": report["model_ratio"],
        "params_before": report["params_dense"],
        "params_now": report["params"],
        "tensorized_ratio": report["tensorized_ratio"],
        "file_ratio": report["file_ratio"],
        "file_bytes": report["file_bytes"],
        "dense_bytes": report["dense_bytes"],
        "report_checkpoint_id": report["checkpoint_id"],
        **({"fidelity_cosine": report["fidelity"]["mean"]} if report.get("fidelity") else {}),
        **target_summary(report.get("target")),
        **chance_summary(report.get("chance")),
    }


def target_summary(target: dict[str, Any] | None) -> dict[str, Any]:
    """``jobs.compression`` fields of the last size target: reached, the size ratio reached
    (``size_end / size_start`` of that stage) and why it was not."""
    if not target:
        return {}
    return {
        "target_reached": bool(target.get("target_reached")),
        "size_ratio_reached": target.get("ratio_reached"),
        "target_reason": target.get("reason"),
    }


def chance_summary(chance: dict[str, Any] | None) -> dict[str, Any]:
    """``jobs.compression`` fields of the chance check of the final metric."""
    if not chance:
        return {}
    return {"at_chance": bool(chance["at_chance"]), "chance_level": chance["chance"]}


def success_message(report: dict[str, Any]) -> str:
    """The job's ``message`` at SUCCEEDED: the file ratio, and what a user must not miss."""
    ratio = report.get("file_ratio")
    parts = [f"succeeded: file ratio {ratio:.2f}x" if ratio else "succeeded"]
    target = report.get("target") or {}
    if target and not target.get("target_reached"):
        parts.append("size target not reached: " + (target.get("reason") or "unknown"))
    chance = report.get("chance") or {}
    if chance.get("at_chance"):
        parts.append(
            f"final accuracy {chance['value']:.4f} is at chance level ({chance['chance']:.4f}): "
            "the model did not learn the task"
        )
    return "; ".join(parts)
