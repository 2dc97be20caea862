"""The engine-facing half of an attempt: the engine config, the trainer, the export.

Everything that touches torch lives here, so :mod:`worker.pipeline` can claim (or skip) a job
without importing it: a duplicate message costs a database round trip, not a torch import.

Fidelity (``hf_bert``): :func:`measure_fidelity` reloads the exported file
(``engine.export.load_compressed``) and compares its mean-pooled sentence embeddings with the
original model's (the trainer's frozen teacher) on the held-out sentences, one cosine per
sentence; the report gets their mean, minimum and count.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import engine
from api_schemas import JobCreate
from engine.data import DataError
from engine.export import ExportInfo, export_compressed, load_compressed
from engine.models.hf_bert import mean_pool
from engine.train import ConfigError, JobConfig, Trainer, TrainResult
from service.spec import to_engine
from worker.artifacts import publish_dir

__all__ = ["ENGINE_VERSION", "ResumeError", "build_config", "build_trainer", "export_model",
           "measure_fidelity", "total_steps"]  # fmt: skip

ENGINE_VERSION: str | None = getattr(engine, "__version__", None)


class ResumeError(Exception):
    """A checkpoint the trainer cannot continue (another config, device or format)."""


def build_config(spec: JobCreate, *, train: str | None, valid: str | None,
                 model: str | None = None) -> tuple[JobConfig, str]:  # fmt: skip
    """The validated engine config and the device it runs on (``auto``: CUDA if present);
    ``model``: the resolved model directory of an ``hf_bert`` source."""
    device = "cuda" if spec.training.device != "cpu" and torch.cuda.is_available() else "cpu"
    data = to_engine(spec, train_path=train, valid_path=valid, device=device, model_path=model)
    return JobConfig.from_dict(data), device


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


def total_steps(trainer: Trainer, config: JobConfig) -> int | None:
    """Optimizer steps of the whole schedule, or None when an epoch's length is unknown."""
    per_epoch = trainer.data.train.num_batches()
    total = 0
    for stage in config.schedule:
        if stage.steps is not None:
            total += stage.steps
        elif per_epoch is not None and stage.epochs is not None:
            total += per_epoch * stage.epochs
        else:
            return None
    return total


def export_model(trainer: Trainer, result: TrainResult, out: Path,
                 extra: dict[str, Any]) -> ExportInfo:  # fmt: skip
    """The compressed model into ``out`` (written to a temporary sibling, then renamed)."""
    config = trainer.job
    stages = result.report["stages"]
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        info = export_compressed(
            result.model, tmp, arch=config.model.arch,
            model_config=trainer.model_config.to_dict(),
            options=config.compression.options.to_dict(), tensorized=config.tensorized,
            metrics=stages[-1]["metrics"] if stages else {},
            extra={**extra, "method": config.method,
                   "execution": result.report.get("execution")})  # fmt: skip
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportInfo(out, out / info.weights_path.name, out / info.manifest_path.name,
                      info.file_bytes, info.sha256, info.manifest)  # fmt: skip


@torch.no_grad()
def measure_fidelity(trainer: Trainer, export_dir: Path) -> dict[str, Any] | None:
    """``hf_bert``: cosine of the exported model's sentence embeddings with the original's on
    the held-out sentences (at most ``training.eval_batches`` batches); None otherwise."""
    teacher = getattr(trainer.model, "teacher", None)
    valid = trainer.data.valid
    if trainer.job.model.arch != "hf_bert" or teacher is None or valid is None:
        return None
    student, _ = load_compressed(export_dir, device=trainer.device)
    limit, cosines = trainer.job.training.eval_batches, []
    for i, batch in enumerate(valid.batches(0)):
        if limit is not None and i >= limit:
            break
        b = {k: v.to(trainer.device) for k, v in batch.items()}
        ids, mask, types = b["input_ids"], b["attention_mask"], b.get("token_type_ids")
        got = mean_pool(student(ids, mask, types), mask)  # (B, D)
        want = mean_pool(teacher(ids, mask, types), mask)  # (B, D)
        cosines.append(F.cosine_similarity(got, want, dim=-1).double().cpu())  # (B,)
    if not cosines:
        return None
    cos = torch.cat(cosines)  # (N,)
    return {"metric": "cosine", "mean": float(cos.mean()), "min": float(cos.min()),
            "sentences": int(cos.numel()), "split": "valid", "measured_on": "export"}  # fmt: skip


def gpu_memory() -> int | None:
    """Bytes allocated on the current GPU, if this process uses one."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_allocated())
    return None
