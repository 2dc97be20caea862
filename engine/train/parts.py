"""What a trainer is made of, built from a job: data, model, optimizer and rank control.

:func:`build_parts` does it in the order the pieces depend on each other: the data first (it
may fix model sizes: a tokenizer's vocabulary, the classes and features of an array file), then
the model (dense or tensorized), its data-dependent initialization on a fresh run (``hf_bert``:
whitened TT-SVD; a resumed run restores instead), the workload's set-up, the optimizer and, for
CoMERA jobs, the :class:`engine.train.rank_control.RankControl`. In a data-parallel run rank 0
builds the data first (it may write a trained tokenizer) and the others after a barrier.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn

from engine.data import DataBundle, build_data
from engine.models.registry import get_workload
from engine.rank import tensorized_layers
from engine.train.auto_rank import AutoRank, calibrate
from engine.train.auto_start import warm_start_
from engine.train.config import ConfigError, as_config_error
from engine.train.distributed import DistContext
from engine.train.job import JobConfig
from engine.train.optim import build_optimizer
from engine.train.rank_control import RankControl

__all__ = ["Parts", "build_parts", "check_distributed", "job_data"]


@dataclass
class Parts:
    workload: Any
    data: Any
    model_config: Any
    model: nn.Module
    setup: dict[str, Any] | None
    names: dict[nn.Parameter, str]
    optimizer: torch.optim.Optimizer
    control: RankControl | None


def check_distributed(job: JobConfig, ctx: DistContext, device: torch.device) -> torch.device:
    """Refuse what a data-parallel run cannot do; the rank's device."""
    tr = job.training
    if tr.batch_size % ctx.world:
        raise ConfigError(
            "training.batch_size",
            f"the global batch {tr.batch_size} must divide among {ctx.world} processes",
        )
    if tr.cuda_graph == "on":
        raise ConfigError("training.cuda_graph", "'on' needs one process (world size 1)")
    if device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    return device


def job_data(job: JobConfig, workdir: Path) -> DataBundle:
    """The job's data as its trainer builds it (``workdir``: where a trained tokenizer goes)."""
    return build_data(
        job.data,
        arch=job.model.arch,
        batch_size=job.training.batch_size,
        seed=job.training.seed,
        workdir=workdir,
        model_config=job.model.config,
    )


def build_parts(
    job: JobConfig,
    workdir: Path,
    device: torch.device,
    dist: DistContext | None,
    *,
    fresh: bool,
) -> Parts:
    torch.manual_seed(job.training.seed)
    workload = get_workload(job.model.arch)
    main = dist is None or dist.main
    if not main:  # rank 0 writes what the data needs (a trained tokenizer) first
        torch_dist.barrier()
    data = job_data(job, workdir)
    if dist is not None and main:
        torch_dist.barrier()
    model_config = job.model_config(data.model_overrides)
    opts = job.compression.options
    # max_rank "auto": a fresh run chooses the rank by a dense calibration run (every layer
    # starts at the largest layer's choice); a resumed one builds at the cap and takes the
    # checkpoint's shapes and choice
    auto, twin = None, None
    if job.tensorized and opts.max_rank == "auto" and fresh:
        auto, twin = calibrate(job, workload, data, model_config, device)
        if dist is not None:  # every rank builds rank 0's choice
            box = [auto.to_dict()]
            torch_dist.broadcast_object_list(box, src=0)
            auto = AutoRank.from_dict(box[0])
        opts = opts.replace(max_rank=auto.build_rank, linear_d=opts.linear_order)
    try:
        model = workload.build(model_config, tensorized=job.tensorized, options=opts).to(device)
    except ValueError as err:  # a stage or option that does not fit the model
        raise as_config_error(err, "compression") from None
    if job.tensorized and not tensorized_layers(model):
        raise ConfigError(
            "compression.layers",
            f"no layer of the {job.model.arch!r} "
            f"model matches {list(opts.layers)}: nothing to compress",
        )
    if twin is not None:  # the automatic start: the calibrated dense twin, decomposed
        try:
            auto.probe["start"] = warm_start_(model, twin)
        except ValueError as err:  # a model whose dense twin does not correspond: a fresh draw
            auto.probe["start"] = {"from": "a fresh draw", "why": str(err)}
    if fresh:  # data-dependent init (hf_bert: whitened TT-SVD); resume restores instead
        workload.prepare(model, data.train.batches(0), device=device)
    setup = workload.setup(model, data.train, job, device=device)
    names = {p: n for n, p in model.named_parameters()}
    optimizer = build_optimizer(
        model,
        job.method,
        job.schedule[0].lr,
        options=opts,
        weight_decay=job.training.weight_decay,
        galore=job.galore,
    )
    comp = job.compression
    control = None
    if job.tensorized:
        control = RankControl(
            model,
            optimizer,
            names,
            penalty=comp.penalty,
            shrink_every=comp.shrink_every,
            max_metric_drop=comp.max_metric_drop,
            min_rank_fraction=comp.min_rank_fraction,
            metric=workload.guard_metric_of(model_config),
            bypassed=workload.bypassed,
        )
        control.auto_rank = auto.to_dict() if auto is not None else None
    return Parts(workload, data, model_config, model, setup, names, optimizer, control)
