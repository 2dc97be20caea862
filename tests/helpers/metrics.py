"""A model's validation metrics recomputed in the test, with the engine's building blocks
(the job's data, the workload's loss sums and summary), to check what a run reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.models.registry import get_workload
from engine.train import JobConfig
from engine.train.parts import job_data

__all__ = ["validation_batches", "validation_metrics"]


def validation_batches(cfg: JobConfig, workdir: Path) -> list[dict[str, Any]]:
    """One pass of the job's validation data, built as its trainer builds it (in ``workdir``)."""
    return list(job_data(cfg, workdir).valid.batches(0))


def validation_metrics(
    model: torch.nn.Module, engine_config: dict[str, Any], workdir: Path
) -> dict[str, float]:
    """Metrics of ``model`` over one pass of the job's validation data (built in ``workdir``)."""
    cfg = JobConfig.from_dict(engine_config)
    workload, sums = get_workload(cfg.model.arch), {}
    with torch.no_grad():
        for batch in validation_batches(cfg, workdir):
            for k, v in workload.forward_loss(model, batch).sums.items():
                sums[k] = sums.get(k, 0.0) + float(v)
    return workload.summarize(sums)
