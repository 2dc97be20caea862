"""The engine-facing half of an attempt: the engine config, the trainer, the export.

Everything that touches torch lives here, so :mod:`worker.pipeline` can claim (or skip) a job
without importing it: a duplicate message costs a database round trip, not a torch import.

Fidelity (``hf_bert``): :func:`measure_fidelity` (``engine.train.fidelity``, re-exported)
reloads the exported file and compares its mean-pooled sentence embeddings with the original
model's on the held-out sentences; a job in several processes gets the same measure from rank
0's ``report.json``.

The engine config is the one prepared at submission and stored with the job
(:func:`load_config`: read, its root-relative paths resolved again on this worker, its device
this worker's). Before the trainer is built, :func:`preflight` plans the job again on this
worker (the checks the planner made at submission, on the files as the worker sees them).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from sqlalchemy.orm import Session

import engine
from api_schemas import JobCreate
from api_schemas.engine_spec import Spec, SpecError, engine_pointer, to_engine
from engine.data import DataError
from engine.export import ExportInfo, export_compressed
from engine.train import ConfigError, JobConfig, Trainer, TrainResult
from engine.train.checkpoint import FORMAT_VERSION as CHECKPOINT_FORMAT
from engine.train.fidelity import measure_fidelity
from engine.train.refactor_stage import export_options
from engine.train.resume import check_compatible
from engine.train.state import TrainState
from service.store.db.models import Job
from service.store.prepare import Roots, worker_engine_config
from service.store.settings import Settings
from worker.artifacts import publish_dir

__all__ = [
    "ENGINE_VERSION",
    "ResumeError",
    "build_config",
    "build_trainer",
    "check_resumable",
    "export_model",
    "load_config",
    "measure_fidelity",
    "preflight",
    "total_steps",
    "worker_device",
]

ENGINE_VERSION: str | None = getattr(engine, "__version__", None)


class ResumeError(Exception):
    """A checkpoint the trainer cannot continue (another config, device or format)."""


def worker_device(wanted: str) -> str:
    """The device this worker runs a job on: ``auto`` is CUDA if present; ``cuda`` without a
    GPU is a ``SpecError`` on ``/training/device``."""
    cuda = torch.cuda.is_available()
    if wanted == "cuda" and not cuda:
        raise SpecError("/training/device", "'cuda' was asked for but this worker has no GPU")
    return "cuda" if wanted != "cpu" and cuda else "cpu"


def load_config(*, session: Session, settings: Settings, job: Job) -> tuple[JobConfig, str, bool]:
    """The job's engine config on this worker, its device, and whether it was prepared here.

    The stored ``engine_config`` (prepared once at submission,
    :func:`service.store.prepare.prepare_job`) is read, not translated again: only its
    root-relative paths are resolved again under this worker's roots and its device is this
    worker's (:func:`service.store.prepare.worker_engine_config`). A job stored without a
    config of this version is prepared here from its spec (then ``True``: the pipeline stores
    the config it ran)."""
    roots = Roots.server(settings=settings, session=session, tenant_id=job.tenant_id)
    spec = job.spec or {}
    data, fresh = worker_engine_config(spec, job.engine_config, roots)
    device = worker_device(spec.get("training", {}).get("device", "auto"))
    data["training"] = {**data["training"], "device": device}
    return JobConfig.from_dict(data), device, fresh


def build_config(
    spec: JobCreate, *, train: str | None, valid: str | None, model: str | None = None
) -> tuple[JobConfig, str]:
    """The validated engine config of ``spec`` with resolved files and the device it runs on
    (``auto``: CUDA if present); ``model``: the resolved model directory of an ``hf_bert``
    source. A spec translated here, not the stored config: :func:`load_config` reads that."""
    device = worker_device(spec.training.device)
    data = to_engine(spec, train_path=train, valid_path=valid, device=device, model_path=model)
    return JobConfig.from_dict(data), device


def preflight(config: JobConfig, spec: Spec, *, capacity_bytes: int) -> dict[str, Any]:
    """The job's plan on this worker, with its real data (``worker.plan.plan_job``): the
    data-derived sizes within the bounds of ``model.config`` and the memory estimate within
    ``capacity_bytes``, checked before anything is built (a ``SpecError`` naming the field).
    ``spec``: the submitted spec (a ``JobCreate`` or the stored dict), for the dataset's
    pointer."""
    from worker.plan import plan_job

    pointer = engine_pointer("data.train", spec)  # the dataset's reference in the spec
    return plan_job(config.to_dict(), capacity_bytes=capacity_bytes, dataset_pointer=pointer)


def build_trainer(config: JobConfig, *, resume: Path | None, **kwargs: Any) -> Trainer:
    """``Trainer(config, resume=resume, **kwargs)``; a checkpoint that cannot be resumed
    raises :class:`ResumeError` (bad configs and data keep their own errors)."""
    if resume is None:
        return Trainer(config, **kwargs)
    try:
        return Trainer(config, resume=resume, **kwargs)
    except (ConfigError, DataError):
        raise
    except ValueError as exc:  # engine.train.trainer: a different config, or not a checkpoint
        raise ResumeError(str(exc)) from None


def check_resumable(config: JobConfig, path: Path | None) -> Path | None:
    """``path`` when it is a checkpoint that can continue ``config`` (read from its header:
    the format and the job config it was written by), else :class:`ResumeError`. What a
    data-parallel job checks before its processes start, as :func:`build_trainer` does."""
    if path is None:
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
        meta = json.loads(header["comera"])
        if meta.get("format_version") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"{path}: checkpoint format {meta.get('format_version')!r}, this engine reads "
                f"{CHECKPOINT_FORMAT}"
            )
        check_compatible(meta["job"], config.to_dict(), TrainState.from_dict(meta["state"]), path)
    except ValueError as exc:  # a different config or format
        raise ResumeError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 (safetensors' errors, a header without our keys)
        raise ResumeError(f"{path}: not a readable CoMERA checkpoint ({exc})") from None
    return path


def total_steps(trainer: Trainer, config: JobConfig) -> int | None:
    """Optimizer steps of the whole schedule, or None when an epoch's length is unknown."""
    return config.total_steps(trainer.data.train.num_batches())


def export_model(
    trainer: Trainer, result: TrainResult, out: Path, extra: dict[str, Any]
) -> ExportInfo:
    """The compressed model into ``out`` (written to a temporary sibling, then renamed)."""
    config = trainer.job
    stages = result.report["stages"]
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        info = export_compressed(
            result.model,
            tmp,
            arch=config.model.arch,
            model_config=trainer.model_config.to_dict(),
            options=export_options(trainer),
            tensorized=config.tensorized,
            metrics=stages[-1]["metrics"] if stages else {},
            extra={
                **extra,
                "method": config.method,
                "execution": result.report.get("execution"),
                "target": result.report.get("target"),
                "chance": result.report.get("chance"),
                "auto_rank": result.report.get("auto_rank"),
                "advice": result.report.get("advice"),
            },
        )
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportInfo(
        out,
        out / info.weights_path.name,
        out / info.manifest_path.name,
        info.file_bytes,
        info.sha256,
        info.manifest,
    )


def gpu_memory() -> int | None:
    """Bytes allocated on the current GPU, if this process uses one."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_allocated())
    return None
