"""The pipeline end to end on both stores, called directly (no Celery): a tiny real job."""

from __future__ import annotations

import hashlib
import math
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import select

import engine
from api_schemas import JobState
from engine.export import load_compressed
from service.store.db.models import Dataset, LatestMetric, Tenant, utcnow
from service.store.db.session import session_scope
from tests.helpers.metrics import validation_metrics
from tests.worker import jobs
from worker.pipeline import run_job

S = JobState


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_job_runs_records_its_series_and_exports_a_checked_model(db_url, tmp_path):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec())

    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "succeeded"

    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "SUCCEEDED" and job.error is None
    assert job.started_at is not None and job.finished_at is not None
    assert job.lease_owner is None and job.engine_version == engine.__version__
    assert job.engine_config["method"] == "comera"
    assert attempt.exit_reason == "completed" and attempt.ended_at and attempt.worker
    assert job.progress == {
        "step": 35,
        "total_steps": 35,
        "fraction": 1.0,
        "stage_index": 2,
        "stage_name": "polish",
        "stage_count": 3,
    }
    # metric series: one point per logged step, the documented keys, no duplicates
    series = jobs.metric_series(factory, job_id)
    assert sorted(series["loss"]) == [5, 10, 15, 20, 25, 30, 35]
    assert {
        "accuracy",
        "objective",
        "penalty",
        "size",
        "lr/cores",
        "val_loss",
        "val_accuracy",
        "ratio",
    } <= set(series)
    with session_scope(factory) as s:
        latest = {
            r.key: (r.step, r.value)
            for r in s.scalars(select(LatestMetric).where(LatestMetric.job_id == job_id))
        }
    assert latest["loss"] == (35, series["loss"][35])
    assert latest["val_loss"] == (35, series["val_loss"][35])
    # checkpoints: rotated ones are marked deleted; the rest match their files
    rows = jobs.checkpoints(factory, job_id)
    by_kind = {(r.kind, r.step): r for r in rows}
    assert set(by_kind) == {
        ("latest", 10),
        ("latest", 20),
        ("latest", 30),
        ("final", 35),
        ("export", 35),
    }
    assert by_kind[("latest", 10)].state == "deleted"
    assert not (settings.artifacts / by_kind[("latest", 10)].path).exists()
    for r in rows:
        if r.state == "complete":
            path = settings.artifacts / r.path
            assert r.sha256 == _sha(path) and r.size_bytes == path.stat().st_size, r.kind
    # the export: loads, and reproduces the final validation loss it reports
    export = by_kind[("export", 35)]
    model, manifest = load_compressed((settings.artifacts / export.path).parent)
    report = export.manifest["report"]
    assert export.manifest["weights"]["sha256"] == export.sha256 == manifest["weights"]["sha256"]
    assert report["checkpoint_id"] == export.id == job.compression["report_checkpoint_id"]
    assert report["metrics"]["val_loss"] == pytest.approx(series["val_loss"][35], rel=1e-12)
    measured = validation_metrics(model, job.engine_config, tmp_path / "eval")
    assert measured["loss"] == pytest.approx(report["metrics"]["val_loss"], rel=1e-5)
    assert job.compression["file_ratio"] == report["file_ratio"] > 1
    assert job.compression["params_now"] < job.compression["params_before"]
    # rank trajectory: one point per layer per ranks event, ending at the exported ranks
    ranks = jobs.rank_series(factory, job_id)
    exported = {layer["name"]: layer["ranks"] for layer in manifest["layers"]}
    assert {t for t, _ in ranks} == set(exported) == {"hidden.0", "hidden.1"}
    assert {t: ranks[(t, 35)] for t in exported} == exported
    # events: the state history, stages, checkpoints, ranks and metric summaries
    evs = jobs.events(factory, job_id)
    assert [e.data["state"] for e in evs if e.kind == "state"] == [
        "QUEUED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert {"stage", "metric", "rank", "checkpoint"} <= {e.kind for e in evs}
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    # tenancy (docs/service.md#authentication-and-tenancy): every row the run wrote, in every
    # table of a job's rows, is the tenant's
    for table, tenants in jobs.row_tenants(factory, job_id).items():
        assert tenants and set(tenants) == {jobs.TENANT}, table


def test_a_duplicate_or_stale_message_is_a_no_op(db_url, tmp_path):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec())
    assert run_job(job_id=job_id, attempt=2, settings=settings, factory=factory) == "skipped"
    lease = {"lease_owner": "other:1", "lease_expires_at": utcnow() + timedelta(seconds=60)}
    # another worker claimed attempt 1 first
    jobs.move(factory, job_id, S.QUEUED, S.STARTING, attempt=1, **lease)
    before, _ = jobs.get(factory, job_id)
    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "skipped"
    after, [attempt] = jobs.get(factory, job_id)
    assert (after.state, after.version, after.event_seq, after.lease_owner) == (
        "STARTING",
        before.version,
        before.event_seq,
        "other:1",
    )
    assert attempt.worker is None and attempt.ended_at is None
    assert not (settings.artifacts / "jobs" / job_id).exists()


@pytest.mark.parametrize(
    ("section", "pointer", "words"),
    [
        (
            {"compression": {"layers": ["nothing.*"], "min_size": 16}},
            "/compression/layers",
            "compression.layers",
        ),
    ],
)
def test_a_spec_the_engine_refuses_fails_naming_the_field(
    db_url, tmp_path, section, pointer, words
):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(**section))
    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "failed"
    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == "validation" and attempt.ended_at
    assert job.error["type"] == "https://comera.dev/problems/validation"
    assert job.error["retryable"] is False and job.error["status"] == 422
    assert job.error["errors"][0]["pointer"] == pointer
    assert words in job.error["detail"] and words in job.message
    assert not jobs.checkpoints(factory, job_id)


def _npz(path, rows: int, *, poison: bool = False, huge: bool = False) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 64)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
    if poison:
        x[7, 3] = np.nan
    if huge:  # finite inputs whose activations overflow: the loss becomes NaN
        x = np.sign(x) * np.float32(3e38)
    np.savez(path, x=x, y=y)


def _path_spec(path: str) -> dict:
    dataset = {"source": "path", "path": path, "format": "npz", "valid_every": 4}
    return jobs.tiny_spec(
        dataset=dataset,
        schedule=[{"kind": "early", "steps": 6}],
        training={"batch_size": 16, "log_every": 3},
    )


@pytest.mark.parametrize(
    ("name", "kind", "words"),
    [
        ("escape.npz", "validation", "must stay under the server's data root"),
        ("missing.npz", "validation", "no file 'missing.npz' under the server's data root"),
        ("loop.npz", "validation", "a symlink loop"),  # RuntimeError on Python 3.11
        ("bad.npz", "data_error", "bad.npz: row 7"),
        ("huge.npz", "nan_loss", "loss is nan at step 3"),
        ("good.npz", None, None),
    ],
)
def test_server_side_dataset_files_stay_inside_the_data_root(db_url, tmp_path, name, kind, words):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    settings.data.mkdir(parents=True)
    _npz(tmp_path / "outside.npz", 128)
    (settings.data / "escape.npz").symlink_to(tmp_path / "outside.npz")
    (settings.data / "loop.npz").symlink_to("loop.npz")
    _npz(settings.data / "bad.npz", 128, poison=True)
    _npz(settings.data / "good.npz", 128)
    _npz(settings.data / "huge.npz", 128, huge=True)
    job_id = jobs.make_job(factory, _path_spec(name))

    outcome = run_job(job_id=job_id, attempt=1, settings=settings, factory=factory)

    job, [attempt] = jobs.get(factory, job_id)
    if kind is None:
        assert outcome == "succeeded" and job.state == "SUCCEEDED"
        assert not math.isnan(jobs.metric_series(factory, job_id)["val_loss"][6])
        return
    assert outcome == "failed" and job.state == "FAILED" and attempt.exit_reason == kind
    assert job.error["type"].endswith(f"/{kind}") and words in job.error["detail"]
    assert str(tmp_path) not in job.error["detail"]  # no server paths in user messages
    if kind == "validation":
        assert job.error["errors"][0]["pointer"] == "/dataset/path"


@pytest.mark.parametrize("owner", ["own", "other"])
def test_an_uploaded_dataset_is_read_only_by_its_tenant(db_url, tmp_path, owner):
    settings, factory = jobs.settings_for(tmp_path, db_url), jobs.factory_for(db_url)
    stored = settings.artifacts / "datasets" / "ds_1" / "data.npz"
    stored.parent.mkdir(parents=True)
    _npz(stored, 128)
    job_id = jobs.make_job(
        factory,
        jobs.tiny_spec(
            dataset={"source": "upload", "dataset_id": "ds_1", "format": "npz", "valid_every": 4},
            schedule=[{"kind": "early", "steps": 4}],
        ),
    )
    with session_scope(factory) as s:
        if owner == "other":
            s.add(Tenant(id="ten_other", name="other"))
            s.flush()
        s.add(
            Dataset(
                id="ds_1",
                tenant_id=jobs.TENANT if owner == "own" else "ten_other",
                name="d",
                format="npz",
                path="datasets/ds_1/data.npz",
                size_bytes=stored.stat().st_size,
                sha256=_sha(stored),
                state="ready",
            )
        )
    outcome = run_job(job_id=job_id, attempt=1, settings=settings, factory=factory)
    job, _ = jobs.get(factory, job_id)
    if owner == "own":
        assert outcome == "succeeded" and job.engine_config["data"]["train"] == str(stored)
    else:  # another tenant's upload does not exist for this job
        assert outcome == "failed" and job.error["errors"][0]["pointer"] == "/dataset/dataset_id"
