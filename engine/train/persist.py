"""Writing and reading a trainer's checkpoints (the file format is :mod:`engine.train.checkpoint`).

:func:`save` gathers everything exact resume needs: the model, the optimizer, the RNG states,
the logging window, the rank control's state (importance window, auto gamma, guard snapshot
and back-off), the stage-start teacher (:mod:`engine.train.teacher`) and the trainer's
position. In a data-parallel run every rank takes part (the RNG states of
all ranks are gathered) but only rank 0 writes; the others wait at a barrier until the file
exists. :func:`resume_` restores all of it; a run at the world size of the checkpoint takes
back its own RNG state (bitwise resume), one at another world size rank 0's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from engine.train import checkpoint as ckpt
from engine.train.distributed import gather_rng
from engine.train.refactor_stage import refactor_stage_
from engine.train.resume import check_compatible
from engine.train.state import TrainState
from engine.train.teacher import StageTeacher, teacher_output
from engine.version import __version__

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

__all__ = ["save", "resume_"]


def save(trainer: Trainer, *, partial: bool = False, final: bool = False) -> Path:
    t, ctx = trainer, trainer.dist
    name = "final" if final else f"step-{t.state.global_step:08d}"
    name += "-partial" if partial else ""
    path = t.workdir / "checkpoints" / f"{name}.safetensors"
    rng = ckpt.rng_tensors()
    world_rng = gather_rng(ctx) if ctx is not None else None  # a collective: every rank
    if ctx is None or ctx.main:
        tensors = {f"model/{k}": v for k, v in t.model.state_dict().items()}
        opt_tensors, opt_meta = ckpt.optimizer_tensors(t.optimizer, t.names)
        tensors.update(opt_tensors)
        tensors.update(rng)
        for r, state in enumerate(world_rng or []):
            tensors[f"rng/rank{r}/torch"] = state
        tensors.update({f"window/{k}": v for k, v in t.window.items()})
        if t.control is not None:
            tensors.update(t.control.tensors())
            t.state.control = t.control.to_dict()
        if t.teacher is not None:
            tensors.update(t.teacher.tensors())
        meta = {
            "engine_version": __version__,
            "job": t.job.to_dict(),
            "state": t.state.to_dict(),
            "optimizer": opt_meta,
            "model_config": t.model_config.to_dict(),
            "partial": partial,
            "world_size": ctx.world if ctx is not None else 1,
        }
        # a partial checkpoint (a stop) has a file of its own, outside the rotation: a stop
        # right after a periodic checkpoint neither rewrites nor rotates that one away
        ckpt.save_checkpoint(path, tensors, meta)
        if not final and not partial:
            t.checkpoints.append(path)
            while len(t.checkpoints) > t.job.checkpoint.keep:
                t.checkpoints.pop(0).unlink(missing_ok=True)
        t.events.emit(
            {
                "event": "checkpoint",
                "path": str(path),
                "partial": partial,
                "step": t.state.global_step,
                "bytes": path.stat().st_size,
            }
        )
    if ctx is not None:
        dist.barrier()
    return path


def resume_(trainer: Trainer, path: Path) -> None:
    t, ctx = trainer, trainer.dist
    tensors, meta = ckpt.read_checkpoint(path)
    state = TrainState.from_dict(meta["state"])
    check_compatible(meta["job"], t.job.to_dict(), state, path)
    begun = state.stage + (1 if state.stage_started else 0)
    for stage in t.job.schedule[:begun]:  # the layers a begun stage rewrote, as it did
        refactor_stage_(t, stage, saved=tensors)
    ckpt.load_model_state_(t.model, tensors)
    ckpt.load_optimizer_state_(t.optimizer, t.names, tensors, meta["optimizer"])
    ckpt.restore_rng(tensors)
    world = ctx.world if ctx is not None else 1
    own = tensors.get(f"rng/rank{ctx.rank}/torch") if ctx is not None else None
    if own is not None and meta.get("world_size", 1) == world:
        torch.set_rng_state(own)
    t.state = state
    t.window = {
        k[len("window/") :]: v.to(t.device) for k, v in tensors.items() if k.startswith("window/")
    }
    if t.control is not None:
        stage = t.job.schedule[state.stage] if state.stage_started else None
        t.control.load(stage, state.control, tensors)
    out = teacher_output(t.workload)
    t.teacher = None if out is None else StageTeacher.from_tensors(t.model, out, tensors)
