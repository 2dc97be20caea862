"""``service.store.prepare``: one resolver and one error type for a job's dataset, one
translation of its spec, and what the worker reads back from the stored engine config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api_schemas import JobCreate
from api_schemas.engine_spec import ENGINE_CONFIG_VERSION, SpecError, to_engine
from service.store.db.models import Dataset, Tenant
from service.store.db.session import make_engine, make_sessionmaker, session_scope
from service.store.prepare import (
    PreparedJob,
    PrepareError,
    Roots,
    is_prepared,
    prepare_job,
    resolve_dataset,
    worker_engine_config,
)

TENANT = "ten_prep"


def _spec(dataset: dict[str, Any], **over: Any) -> JobCreate:
    body: dict[str, Any] = {
        "name": "prep",
        "model": {"arch": "mlp", "config": {"hidden": [16]}},
        "dataset": dataset,
        "schedule": [{"kind": "early", "steps": 2}],
        **over,
    }
    return JobCreate.model_validate(body)


def _path(path: str, **more: Any) -> JobCreate:
    return _spec({"source": "path", "path": path, "format": "npz", **more})


@pytest.fixture
def factory(sqlite_url: str):
    factory = make_sessionmaker(make_engine(sqlite_url))
    with session_scope(factory) as s:
        s.add_all([Tenant(id=TENANT, name="t"), Tenant(id="ten_other", name="o")])
    return factory


def _error(fn, *args: Any, **kwargs: Any) -> PrepareError:
    with pytest.raises(PrepareError) as caught:
        fn(*args, **kwargs)
    assert isinstance(caught.value, SpecError)  # the one error type is the worker's too
    return caught.value


def test_a_path_dataset_resolves_under_the_root_or_names_the_field(tmp_path: Path):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "train.npz").write_bytes(b"x")
    (tmp_path / "outside.npz").write_bytes(b"x")
    (root / "escape.npz").symlink_to(tmp_path / "outside.npz")
    (root / "loop.npz").symlink_to("loop.npz")
    roots = Roots(data=root)

    train, valid = resolve_dataset(_path("sub/train.npz").dataset, roots)
    assert (train, valid) == (str((root / "sub" / "train.npz").resolve()), None)
    cases = {
        "escape.npz": ("outside_root", "must stay under the server's data root"),
        "missing.npz": ("not_found", "no file 'missing.npz' under the server's data root"),
        "loop.npz": ("invalid", "cannot read 'loop.npz': a symlink loop"),
    }
    for name, (code, message) in cases.items():
        err = _error(resolve_dataset, _path(name).dataset, roots)
        assert (err.pointer, err.code, err.message) == ("/dataset/path", code, message)
        assert str(tmp_path) not in err.message  # no server path in a user's message
    err = _error(resolve_dataset, _path("sub/train.npz", valid_path="nope.npz").dataset, roots)
    assert (err.pointer, err.code) == ("/dataset/valid_path", "not_found")
    local = Roots(data=root, data_name="--data-root")  # comera run names its option
    assert _error(resolve_dataset, _path("nope.npz").dataset, local).message == (
        "no file 'nope.npz' under --data-root"
    )


def test_an_uploaded_dataset_is_the_tenants_ready_one_of_the_same_format(tmp_path, factory):
    artifacts = tmp_path / "artifacts"
    stored = artifacts / "datasets" / "ds_1" / "data.npz"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"x")
    with session_scope(factory) as s:
        s.add(
            Dataset(
                id="ds_1",
                tenant_id=TENANT,
                name="d",
                format="npz",
                path="datasets/ds_1/data.npz",
                size_bytes=1,
                sha256="0" * 64,
                state="ready",
            )
        )
    upload = {"source": "upload", "dataset_id": "ds_1", "format": "npz"}
    with session_scope(factory) as s:
        roots = Roots(data=tmp_path / "data", artifacts=artifacts, session=s, tenant_id=TENANT)
        assert resolve_dataset(_spec(upload).dataset, roots) == (str(stored.resolve()), None)
        err = _error(resolve_dataset, _spec({**upload, "format": "text"}).dataset, roots)
        assert (err.pointer, err.code) == ("/dataset/format", "mismatch")
        assert err.message == "dataset ds_1 was uploaded as 'npz', not 'text'"
        other = Roots(data=roots.data, artifacts=artifacts, session=s, tenant_id="ten_other")
        err = _error(resolve_dataset, _spec(upload).dataset, other)
        assert (err.pointer, err.code) == ("/dataset/dataset_id", "not_found")
    err = _error(resolve_dataset, _spec(upload).dataset, Roots(data=tmp_path, data_name="--x"))
    assert err.pointer == "/dataset/source" and "relative to --x" in err.message


def test_prepare_job_translates_once_into_the_versioned_engine_config(tmp_path: Path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "train.npz").write_bytes(b"x")
    spec = _path("train.npz")

    prepared = prepare_job(spec, Roots(data=root), device="cpu")

    train = str((root / "train.npz").resolve())
    assert isinstance(prepared, PreparedJob) and prepared.spec is spec
    assert prepared.engine_config == to_engine(spec, train_path=train, device="cpu")
    assert prepared.engine_config["version"] == ENGINE_CONFIG_VERSION
    assert is_prepared(prepared.engine_config) and not is_prepared(None)
    assert not is_prepared({**prepared.engine_config, "version": ENGINE_CONFIG_VERSION + 1})
    assert prepared.dataset_pointer == "/dataset/path"
    # what the translation refuses is the same error type, code "unsupported"
    text = _spec({"source": "path", "path": "train.npz", "format": "text"})
    err = _error(prepare_job, text, Roots(data=root), device="cpu")
    assert (err.pointer, err.code) == ("/dataset/format", "unsupported")
    cuda = _path("train.npz", valid_every=2).model_copy(
        update={"training": spec.training.model_copy(update={"device": "cuda"})}
    )
    err = _error(prepare_job, cuda, Roots(data=root), device="cpu")
    assert (err.pointer, err.code) == ("/training/device", "unsupported")


def test_the_worker_reads_the_stored_config_and_resolves_only_its_root_relative_paths(
    tmp_path: Path,
):
    api_root, worker_root = tmp_path / "api", tmp_path / "worker"
    for root in (api_root, worker_root):
        (root / "d").mkdir(parents=True)
        (root / "d" / "train.npz").write_bytes(b"x")
        (root / "d" / "valid.npz").write_bytes(b"x")
    spec = _path("d/train.npz", valid_path="d/valid.npz")
    stored = prepare_job(spec, Roots(data=api_root), device="cpu").engine_config
    stored["training"]["batch_size"] = 7  # what the worker runs is what was stored
    body = spec.model_dump(mode="json")

    config, fresh = worker_engine_config(body, stored, Roots(data=worker_root))

    assert not fresh
    assert config["data"]["train"] == str((worker_root / "d" / "train.npz").resolve())
    assert config["data"]["valid"] == str((worker_root / "d" / "valid.npz").resolve())
    assert config["training"]["batch_size"] == 7  # read, not translated again
    unchanged = {k: v for k, v in stored.items() if k != "data"}
    assert {k: v for k, v in config.items() if k != "data"} == unchanged
    assert stored["data"]["train"].startswith(str(api_root.resolve()))  # the input is kept
    # a file gone on the worker's root: the same error as at submission
    (worker_root / "d" / "valid.npz").unlink()
    err = _error(worker_engine_config, body, stored, Roots(data=worker_root))
    assert (err.pointer, err.code) == ("/dataset/valid_path", "not_found")


def test_the_worker_prepares_a_job_stored_without_a_config_of_this_version(tmp_path: Path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "train.npz").write_bytes(b"x")
    spec = _path("train.npz")
    expected = prepare_job(spec, Roots(data=root), device="cpu").engine_config
    body = spec.model_dump(mode="json")
    for stored in (None, {}, {**expected, "version": 0}):
        config, fresh = worker_engine_config(body, stored, Roots(data=root))
        assert fresh and config == expected
    synthetic = _spec({"source": "synthetic", "n_train": 64, "params": {"shape": [4, 4]}})
    stored = prepare_job(synthetic, Roots(data=root), device="cpu").engine_config
    config, fresh = worker_engine_config(synthetic.model_dump(mode="json"), stored, Roots(root))
    assert not fresh and config == stored  # nothing root-relative: the stored config as is
