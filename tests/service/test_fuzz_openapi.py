"""Schemathesis against the app's own OpenAPI document: every operation, with an API key, on a
real PostgreSQL store, in two passes: schema-valid requests (``COMERA_FUZZ_EXAMPLES`` per
operation, default 15) and schema-violating ones (GenerationMode.NEGATIVE,
``COMERA_FUZZ_NEGATIVE_EXAMPLES``, default 8).

Every response must: not be a 5xx, have a documented status code, content type and headers,
and match the documented schema; a negative request must be refused (4xx); every 4xx is a
problem+json document carrying its status. A queued job, a dataset and a SUCCEEDED job with
a complete export (real safetensors weights and manifest, written by the engine's exporter and
catalogued as the worker does) exist first, so every other generated case that names a job,
dataset or checkpoint id is pointed at a real one, and the checkpoint content, manifest and
report endpoints answer 200 under the fuzz.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis import GenerationMode, checks
from schemathesis.core.parameters import ParameterLocation
from sqlalchemy import update

from service.api.deps import get_enqueue, get_revoke
from service.main import create_app
from service.store.db.models import Job
from service.store.settings import Settings
from tests.service.api_helpers import issue_key

EXAMPLES = {
    "positive": int(os.environ.get("COMERA_FUZZ_EXAMPLES", "15")),
    "negative": int(os.environ.get("COMERA_FUZZ_NEGATIVE_EXAMPLES", "8")),
}
MODES = {"positive": GenerationMode.POSITIVE, "negative": GenerationMode.NEGATIVE}
STATE: dict[str, Any] = {}
# the counts of the parametrized cases that ran in this process, by mode
CASES: dict[str, dict[str, Any]] = {m: {"run": 0, "by_status": {}, "by_label": {}} for m in MODES}


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    from tests.helpers.db import migrated_postgres, postgres_available

    if not postgres_available():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    home = tmp_path_factory.mktemp("fuzz")
    with migrated_postgres() as url:
        settings = Settings(
            home=home,
            database_url=url,
            broker_url="memory://",
            max_body_bytes=64 * 1024,
            max_upload_bytes=64 * 1024,
            rate_limit_per_minute=0,
            # schemathesis probes every operation with invalid credentials, all from one
            # client address: the failed-authentication limit would answer them 429
            auth_failures_per_minute=0,
        )
        app = create_app(settings)
        app.dependency_overrides[get_enqueue] = lambda: lambda **_: True  # sent, nowhere
        app.dependency_overrides[get_revoke] = lambda: lambda _task_id: None
        with TestClient(app) as client:  # runs the lifespan (engine, caches)
            STATE["key"] = issue_key(app)
            client.headers["Authorization"] = f"Bearer {STATE['key']}"
            _seed(client, app, settings)
            yield app


def _seed(client: TestClient, app: FastAPI, settings: Settings) -> None:
    """Rows for generated requests to find: a (queued) job, a dataset and a finished job with
    a complete export; its checkpoint answers 200 here before any fuzzing."""
    from tests.service.api_helpers import job_body

    for name, key in (("job_id", "fuzz-seed"), ("done_job_id", "fuzz-seed-done")):
        r = client.post("/v1/jobs", json=job_body(), headers={"Idempotency-Key": key})
        assert r.status_code == 202, r.text
        STATE[name] = r.json()["id"]
    r = client.post(
        "/v1/datasets?name=seed&format=text",
        content=b"a\nb\n",
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 201, r.text
    STATE["dataset_id"] = r.json()["id"]
    STATE["checkpoint_id"] = _seed_export(app, settings, STATE["done_job_id"])
    base = f"/v1/jobs/{STATE['done_job_id']}"
    for url in (
        f"{base}/checkpoints/{STATE['checkpoint_id']}/content",
        f"{base}/checkpoints/{STATE['checkpoint_id']}/manifest",
        f"{base}/report",
    ):
        assert client.get(url).status_code == 200, url


def _seed_export(app: FastAPI, settings: Settings, job_id: str) -> str:
    """The export the worker writes when ``job_id`` succeeds (``worker.pipeline._succeed``):
    the engine's exporter on a small tensorized MLP (untrained), the catalogue row with its
    file hashes and compression report, and the job SUCCEEDED. Returns the checkpoint id."""
    import torch

    from engine.export.save import export_compressed
    from engine.models.registry import get_workload
    from engine.models.tensorize import TensorizeOptions
    from worker.artifacts import checkpoint_row, sha256_file, workdir
    from worker.report import compression_report

    config = {"in_features": 48, "hidden": [64, 64], "num_classes": 5}
    options = TensorizeOptions(max_rank=4, min_size=256)
    torch.manual_seed(0)
    model = get_workload("mlp").build(config, tensorized=True, options=options)
    out = workdir(settings.artifacts, job_id, 1) / "export"
    info = export_compressed(
        model,
        out,
        arch="mlp",
        model_config=model.config.to_dict(),
        options=options.to_dict(),
        tensorized=True,
        metrics={"loss": 1.5},
    )
    with app.state.sessionmaker() as s, s.begin():
        job = s.get(Job, job_id)
        row = checkpoint_row(
            path=info.weights_path,
            artifacts=settings.artifacts,
            job_id=job_id,
            tenant_id=job.tenant_id,
            attempt=1,
            kind="export",
            step=10,
            stage="late",
            metrics={"val_loss": 1.5},
        )
        assert row.sha256 == info.sha256
        report = compression_report(
            job_id=job_id,
            checkpoint_id=row.id,
            manifest=info.manifest,
            stages=[],
            metrics={"val_loss": 1.5},
            spec_hash=job.spec_hash,
        )
        files = {
            p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in (info.weights_path, info.manifest_path)
        }
        row.manifest = {**info.manifest, "files": files, "report": report}
        s.add(row)
        s.execute(update(Job).where(Job.id == job_id).values(state="SUCCEEDED"))
        return row.id


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_app: FastAPI):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


def _labels() -> list[str]:
    """Operation labels (``GET /v1/jobs``) of the document, without a database (collection)."""
    app = create_app(Settings(home=Path("/tmp/comera-fuzz-doc"), broker_url="memory://"))
    verbs = {"get", "head", "post", "put", "patch", "delete"}
    return [
        f"{method.upper()} {path}"
        for path, item in app.openapi()["paths"].items()
        for method in item
        if method in verbs
    ]


LABELS = _labels()
# "a schema-valid request is accepted": no, where a rule spans fields (a stage gives exactly
# one of epochs and steps; target_ratio only on late stages) or rows (an unknown dataset id),
# which JSON Schema cannot say; those are 422 problem documents, checked like every response
EXCLUDED = [checks.positive_data_acceptance]


ARTIFACT_OPS = ("/checkpoints", "/report")  # operations pointed at the finished job
DOWNLOADS = ("/content", "/manifest", "/report")  # must answer 200 to some valid cases


def _real_rows(case: schemathesis.Case) -> None:
    """Name real rows in the path: the finished job and its export for checkpoint and report
    operations, the queued job (and the dataset) for the others. A path generated to violate
    the schema is left as it is."""
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.PATH):
        return
    params = case.path_parameters or {}
    artifact = any(part in case.operation.path for part in ARTIFACT_OPS)
    real = {
        "job_id": STATE["done_job_id" if artifact else "job_id"],
        "dataset_id": STATE["dataset_id"],
        "checkpoint_id": STATE["checkpoint_id"],
    }
    for name in params.keys() & real.keys():
        params[name] = real[name]


def _headers(case: schemathesis.Case) -> dict[str, str]:
    """The API key, unless the case's headers were generated to violate the schema (the
    ``Authorization`` header is one of them: a missing or malformed one must be refused)."""
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.HEADER):
        return {}
    return {"Authorization": f"Bearer {STATE['key']}"}


def _problem_document(case: schemathesis.Case, response: Any) -> None:
    """A 4xx is ``application/problem+json`` carrying its own status (HEAD: no body)."""
    if 400 <= response.status_code < 500:
        assert response.headers["content-type"][0].startswith("application/problem+json")
        if case.method.upper() != "HEAD":
            assert response.json()["status"] == response.status_code


def _operations(schema: Any) -> dict[str, Any]:
    """The document's operations by label, as schemathesis reads them."""
    return {op.label: op for op in (r.ok() for r in schema.get_all_operations())}


def _fuzz(operation: Any, label: str, mode: str, tally: dict[str, Any], examples: int) -> None:
    """``examples`` generated cases of ``operation`` sent to the app and checked, each counted
    in ``tally``; a mode with nothing to generate raises ``hypothesis.errors.Unsatisfiable``."""

    @hypothesis.given(case=operation.as_strategy(generation_mode=MODES[mode]))
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        tally["run"] += 1
        if tally["run"] % 2:  # every other case names real rows
            _real_rows(case)
        headers = _headers(case)
        response = case.call(headers=headers)
        case.validate_response(response, headers=headers, excluded_checks=EXCLUDED)
        _problem_document(case, response)
        for by in (tally["by_status"], tally["by_label"].setdefault(label, {})):
            by[response.status_code] = by.get(response.status_code, 0) + 1

    run()


def _nothing_to_violate(operation: Any, mode: str) -> bool:
    """Only a negative pass over an operation without parameters may generate nothing."""
    return mode == "negative" and not operation.definition.raw.get("parameters")


# schemathesis' own pytest plugin does not run under pytest 9 here ('Function' object has no
# attribute '_nodeid'), so each operation is one parametrized test driving hypothesis itself
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("label", LABELS)
def test_every_operation_conforms_and_never_5xx(fuzz_schema, label: str, mode: str) -> None:
    operation = _operations(fuzz_schema)[label]
    try:
        _fuzz(operation, label, mode, CASES[mode], EXAMPLES[mode])
    except hypothesis.errors.Unsatisfiable:
        if not _nothing_to_violate(operation, mode):
            raise
        pytest.skip(f"{label} takes no parameters: nothing to violate")
    seen = CASES[mode]["by_label"].get(label, {})
    assert sum(seen.values()) > 0, f"no {mode} case of {label} reached the API"
    if mode == "positive" and any(part in label for part in DOWNLOADS):
        assert seen.get(200, 0) > 0, (label, seen)  # the real rows were served


TALLY_EXAMPLES = 2  # cases per operation and mode of the coverage check below


def test_fuzz_covers_every_operation(fuzz_schema) -> None:
    """The fuzz's coverage, checked in this one test whatever the scheduling (pytest-xdist
    spreads the cases above over its processes, so no process sees all of their counts): the
    cases above are parametrized over every operation of the document, and a short pass of
    its own (``TALLY_EXAMPLES`` per operation and mode, the same strategies and checks) sends
    cases of every operation to the API in both modes, reaches the handlers (not only 401 and
    422) and never gets a 5xx for a violating request.

    ``COMERA_FUZZ_REPORT`` (bench.fuzz_openapi) names a file for the counts of the cases
    above; the bench runs this file in one process, so they are whole here then."""
    ops = _operations(fuzz_schema)
    assert len(ops) >= 20
    assert sorted(LABELS) == sorted(ops), "the parametrized cases must cover every operation"
    tally: dict[str, dict[str, Any]] = {
        m: {"run": 0, "by_status": {}, "by_label": {}} for m in MODES
    }
    for label, operation in ops.items():
        for mode in MODES:
            try:
                _fuzz(operation, label, mode, tally[mode], TALLY_EXAMPLES)
            except hypothesis.errors.Unsatisfiable:
                if not _nothing_to_violate(operation, mode):
                    raise
                continue
            seen = tally[mode]["by_label"].get(label, {})
            assert sum(seen.values()) > 0, f"no {mode} case of {label} reached the API"
    positive, negative = tally["positive"], tally["negative"]
    assert set(positive["by_label"]) == set(ops), positive["by_label"]
    assert sum(n for code, n in positive["by_status"].items() if code < 400) > 0, positive
    assert not any(code >= 500 for code in negative["by_status"]), negative
    for mode, counts in tally.items():
        print(
            f"fuzz coverage {mode}: {counts['run']} cases over {len(ops)} operations, "
            f"statuses {dict(sorted(counts['by_status'].items()))}"
        )
    report = os.environ.get("COMERA_FUZZ_REPORT")
    if report:
        ran = set(CASES["positive"]["by_label"])
        assert ran == set(ops), f"COMERA_FUZZ_REPORT needs every case in this process: {ran}"
        Path(report).write_text(json.dumps({"operations": len(ops), **CASES}, indent=1))
        for label in ops:
            if any(part in label for part in DOWNLOADS):
                print(f"fuzz positive {label}: {CASES['positive']['by_label'][label]}")
