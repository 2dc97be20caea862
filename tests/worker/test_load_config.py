"""``worker.training.load_config``: the worker runs the engine config prepared and stored at
submission (its root-relative paths resolved again under this worker's roots, its device this
worker's), and prepares one itself only for a job stored without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from api_schemas import JobCreate
from api_schemas.engine_spec import SpecError
from service.store.db.models import Job
from service.store.db.session import session_scope
from service.store.prepare import Roots, prepare_job
from tests.worker.jobs import factory_for, make_job, settings_for, tiny_spec
from worker.training import load_config, worker_device


def _npz(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    x = np.zeros((32, 64), np.float32)
    np.savez(path, x=x, y=np.zeros(32, np.int64))


def _spec(**training) -> dict:
    dataset = {"source": "path", "path": "d/train.npz", "format": "npz", "valid_every": 4}
    return tiny_spec(dataset=dataset, training={"batch_size": 16, **training})


def test_the_stored_config_is_read_with_this_workers_paths_and_device(sqlite_url, tmp_path):
    settings, factory = settings_for(tmp_path / "worker", sqlite_url), factory_for(sqlite_url)
    api_root = tmp_path / "api-data"
    _npz(api_root / "d" / "train.npz")
    _npz(Path(settings.data) / "d" / "train.npz")
    body = _spec()
    job_id = make_job(factory, body)
    stored = prepare_job(JobCreate.model_validate(body), Roots(data=api_root), device="cpu")
    stored.engine_config["training"]["log_every"] = 3  # a stored value the spec does not say
    with session_scope(factory) as s:
        s.get(Job, job_id).engine_config = stored.engine_config

    with session_scope(factory) as s:
        config, device, fresh = load_config(session=s, settings=settings, job=s.get(Job, job_id))

    assert not fresh and device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert config.data.train == str((Path(settings.data) / "d" / "train.npz").resolve())
    assert config.training.log_every == 3 and config.training.device == device


def test_a_job_stored_without_a_config_is_prepared_by_the_worker(sqlite_url, tmp_path):
    settings, factory = settings_for(tmp_path, sqlite_url), factory_for(sqlite_url)
    _npz(Path(settings.data) / "d" / "train.npz")
    job_id = make_job(factory, _spec(device="cpu"))

    with session_scope(factory) as s:
        config, device, fresh = load_config(session=s, settings=settings, job=s.get(Job, job_id))

    assert fresh and device == "cpu" and config.training.batch_size == 16
    assert config.data.train == str((Path(settings.data) / "d" / "train.npz").resolve())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this worker has a GPU")
def test_cuda_on_a_worker_without_a_gpu_names_the_field():
    assert worker_device("auto") == "cpu" and worker_device("cpu") == "cpu"
    with pytest.raises(SpecError) as caught:
        worker_device("cuda")
    assert caught.value.pointer == "/training/device"


def test_an_hf_dir_is_resolved_again_under_this_workers_data_root(sqlite_url, tmp_path):
    from tests.worker.test_hf_job import _data_root, hf_spec

    settings, factory = settings_for(tmp_path / "worker", sqlite_url), factory_for(sqlite_url)
    api_root, worker_root = tmp_path / "api-data", Path(settings.data)
    _data_root(api_root)
    _data_root(worker_root)
    job_id = make_job(factory, hf_spec())
    stored = prepare_job(JobCreate.model_validate(hf_spec()), Roots(data=api_root), device="cpu")
    original = str((api_root / "models" / "tiny").resolve())
    assert stored.engine_config["model"]["config"]["path"] == original
    with session_scope(factory) as s:
        s.get(Job, job_id).engine_config = stored.engine_config

    with session_scope(factory) as s:
        config, _, fresh = load_config(session=s, settings=settings, job=s.get(Job, job_id))

    assert not fresh
    assert config.model.config["path"] == str((worker_root / "models" / "tiny").resolve())
    assert config.data.valid == str((worker_root / "text" / "valid.txt").resolve())
