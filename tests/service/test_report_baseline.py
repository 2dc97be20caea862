"""The compression report's dense baseline: which job counts as "the same spec", and the
metric deltas against it, served by the API and shown by ``comera report``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import select, update

from api_schemas import CompressionReport
from client.render import report_tables
from service.baseline import baseline_key
from service.store.db.crud.tenants import get_or_create_tenant
from service.store.db.models import Checkpoint, Job
from tests.helpers.specs import mlp_model
from tests.service.api_helpers import Api, add_checkpoint, job_body, make_job, set_state

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WEIGHTS = b"\x00" * 1000


def _export(
    api: Api,
    job_id: str,
    metrics: dict[str, float],
    *,
    file: bool = False,
    fidelity: dict[str, Any] | None = None,
) -> str:
    """A complete export checkpoint of ``job_id`` whose manifest carries ``metrics`` (and the
    worker's report with ``fidelity``, if given)."""
    ckpt_id, rel = f"ckpt_{job_id[-12:]}", f"jobs/{job_id}/export"
    manifest = {
        "layers": [],
        "metrics": metrics,
        "totals": {"stored_params": 100, "dense_equivalent_params": 400},
        "weights": {
            "file": "model.safetensors",
            "bytes": len(WEIGHTS),
            "dense_equivalent_bytes": 1600,
        },
    }
    if fidelity is not None:
        manifest["report"] = {"fidelity": fidelity}
    if file:
        path = Path(api.settings.artifacts) / rel / "model.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(WEIGHTS)
    add_checkpoint(
        api,
        job_id,
        ckpt_id,
        rel,
        kind="export",
        manifest=manifest,
        step=10,
        stage="last",
        metrics={},
        size_bytes=len(WEIGHTS),
        created_at=T0,
    )
    return ckpt_id


def _job(
    api: Api,
    body: dict[str, Any],
    *,
    finished: int,
    state: str = "SUCCEEDED",
    metrics: dict[str, float] | None = None,
) -> str:
    """A finished job ``finished`` hours after T0, with an export when ``metrics`` is given."""
    job_id = make_job(api, body=body, state=state, finished_at=T0 + timedelta(hours=finished))
    if metrics is not None:
        _export(api, job_id, metrics)
    return job_id


def _stored_metrics(api: Api, job_id: str) -> dict[str, float]:
    with api.sessions() as s:
        row = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).one()
        return dict(row.manifest["metrics"])


def dense(**changes: Any) -> dict[str, Any]:
    """The dense twin of ``job_body()``: same model, data and training, 10 steps in all."""
    body = job_body(
        compression={"method": "dense"},
        schedule=[{"kind": "early", "steps": 6}, {"kind": "early", "steps": 4}],
    )
    body.update(changes)
    return body


def test_same_spec_means_model_dataset_training_and_schedule_length():
    key = baseline_key(job_body())
    assert key is not None and key["steps"] == 10 and key["epochs"] == 0
    assert baseline_key(dense()) == key
    assert baseline_key(dense(training={"log_every": 3})) == key  # logging only
    assert baseline_key(dense(schedule=[{"kind": "early", "steps": 9}])) != key
    assert baseline_key(dense(schedule=[{"kind": "early", "epochs": 10}])) != key
    assert baseline_key(dense(training={"seed": 1})) != key
    assert baseline_key(dense(dataset={"source": "synthetic", "n_train": 512})) != key
    assert baseline_key(dense(model=mlp_model(64, 32))) != key
    assert baseline_key({"name": "no schedule"}) is None


def test_report_names_the_newest_dense_job_of_the_same_spec_with_deltas(api: Api):
    job_id = make_job(api, state="SUCCEEDED", body=job_body())
    fidelity = {
        "metric": "cosine",
        "mean": 0.9876,
        "min": 0.9,
        "sentences": 12,
        "split": "valid",
        "measured_on": "export",
    }
    _export(api, job_id, {"loss": 0.41, "accuracy": 0.875}, file=True, fidelity=fidelity)
    older = _job(api, dense(), finished=1, metrics={"accuracy": 0.5})
    base = _job(
        api,
        dense(training={"log_every": 7}),
        finished=2,
        metrics={"loss": 0.35, "accuracy": 0.9, "val_only": 1.0},
    )
    # newer, but not the same spec, not dense, not finished, not exported or not ours
    _job(api, dense(schedule=[{"kind": "early", "steps": 5}]), finished=3, metrics={"loss": 0})
    _job(
        api, dense(dataset={"source": "synthetic", "n_train": 512}), finished=3, metrics={"loss": 0}
    )
    _job(api, dense(training={"seed": 7}), finished=3, metrics={"loss": 0})
    _job(api, job_body(), finished=3, metrics={"loss": 0})  # comera, not dense
    _job(api, dense(), finished=3, state="FAILED", metrics={"loss": 0})
    _job(api, dense(), finished=3)  # no export
    other = _job(api, dense(), finished=3, metrics={"loss": 0})
    with api.sessions() as s:
        tenant = get_or_create_tenant(session=s, name="someone-else").id
    with api.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == other).values(tenant_id=tenant))
        s.execute(update(Checkpoint).where(Checkpoint.job_id == other).values(tenant_id=tenant))

    resp = api.client.get(f"/v1/jobs/{job_id}/report")
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["file_bytes"] == len(WEIGHTS) and report["file_ratio"] == 1.6
    mine, theirs = _stored_metrics(api, job_id), _stored_metrics(api, base)
    by_hand = {
        "accuracy": mine["accuracy"] - theirs["accuracy"],
        "loss": mine["loss"] - theirs["loss"],
    }
    assert report["baseline"] == {"job_id": base, "metrics": theirs, "deltas": by_hand}
    assert by_hand == {"accuracy": 0.875 - 0.9, "loss": 0.41 - 0.35}
    assert report["fidelity"] == fidelity

    out = Console(record=True, width=160)
    out.print(report_tables(CompressionReport.model_validate(report)))
    text = out.export_text()
    assert "against the dense baseline" in text and base in text
    assert "-0.025" in text and "+0.06" in text and "val_only" in text
    assert "fidelity           cosine 0.9876 (min 0.9000) on 12 held-out sentences" in text

    set_state(api, base, "FAILED")  # the next newest match takes its place
    report = api.client.get(f"/v1/jobs/{job_id}/report").json()
    assert report["baseline"]["job_id"] == older
    assert report["baseline"]["deltas"] == {"accuracy": 0.875 - 0.5}
    set_state(api, older, "CANCELLED")
    report = api.client.get(f"/v1/jobs/{job_id}/report").json()
    assert report["baseline"] is None
    out = Console(record=True, width=160)
    out.print(report_tables(CompressionReport.model_validate(report)))
    assert "none (no SUCCEEDED dense job of the same spec)" in out.export_text()
