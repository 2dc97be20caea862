"""Data-parallel training: one process per device, ``DistributedDataParallel`` in each.

The trainer runs the same code in every process (``torchrun`` starts them on one machine,
Ray Train's workers across machines, :mod:`engine.train.ray_driver`; the process group is
``backend="cpu:gloo,cuda:nccl"``, gloo alone on a torch without NCCL or a machine without a
GPU, or for a CPU job under Ray) and keeps one job's semantics whatever the world size ``W``:

* **One global batch.** ``training.batch_size`` is the global batch: every rank builds the same
  batch from (seed, epoch) and keeps its rows, ``torch.tensor_split`` of dim 0 into ``W``
  pieces (:func:`shard`). A last batch with fewer rows than processes is skipped by every
  rank alike.
* **The global batch's dropout masks.** Each step's forward runs in
  :func:`engine.nn.dropout.mask_stream` with the job's seed, the global step and the rank's
  rows (:func:`rows_of`): every CPU dropout mask is drawn from ``(seed, step, i)`` as the mask
  of the global batch and each rank draws only its rows' slice, so a rank drops exactly what
  the one-process run drops in those rows. On CUDA (torch's fused kernels) and in the ``hf``
  workload's transformers modules, each rank draws its own masks from its own generator: not
  equal there (docs/distributed.md).
* **The one-process gradient.** A workload's loss is a mean over its local ``count`` (rows,
  masked tokens, sentences); the rank's loss is scaled by ``W n_local / n_global`` (``n_global``
  all-reduced each step), so DDP's average of the ranks' gradients is the gradient of the global
  mean, for every workload. The rank penalty is the same on every rank and is not scaled.
* **Identical rank decisions.** Gates are parameters, so their all-reduced gradients keep them
  equal; the late stage's switch uses the all-reduced loss; before every shrink, cut or guard
  decision the gates are broadcast from rank 0 (:func:`broadcast_gates_`, which counts and
  repairs any rank that drifted), and every rank evaluates the whole validation set, so every
  rank takes the same decisions without further messages.
* **Shrinks.** DDP fixes parameter shapes when it wraps a module, so at each shrink the
  wrapper is dropped (no autograd graph is alive between steps), the shrink applied and a new
  wrapper built; its constructor checks the shapes across processes and syncs from rank 0.
* **Side effects on rank 0 only:** events and checkpoints (with ``world_size`` and every
  rank's RNG state); the others wait at a barrier. A stop seen by rank 0 reaches every rank at
  the same step (:func:`agree`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "BACKEND",
    "DataParallel",
    "DistContext",
    "LossModule",
    "agree",
    "all_sum",
    "backend",
    "broadcast_gates_",
    "current",
    "finish",
    "gather_rng",
    "init_from_env",
    "rows_of",
    "shard",
]

BACKEND = "cpu:gloo,cuda:nccl"


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int
    local_rank: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def current() -> DistContext | None:
    """The running process group when it has more than one process, else None (whoever set
    it up: ``torchrun`` via :func:`init_from_env`, or Ray Train, which sets ``LOCAL_RANK``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return DistContext(dist.get_rank(), dist.get_world_size(), local)


def init_from_env() -> DistContext | None:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1 in the environment)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    if not dist.is_initialized():
        dist.init_process_group(backend=backend())
    return current()


def backend() -> str:
    """:data:`BACKEND`, or gloo alone where torch has no NCCL (a CPU build) or sees no GPU (a
    CUDA build on a machine without one, where NCCL refuses to start)."""
    return BACKEND if dist.is_nccl_available() and torch.cuda.is_available() else "gloo"


def finish() -> None:
    """Leave the process group (every rank, at the end of a run)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def rows_of(total: int, ctx: DistContext) -> tuple[int, int]:
    """``(start, stop)``: this rank's rows of ``total``, ``torch.tensor_split``'s ``ctx.rank``-th
    piece of ``ctx.world`` (the first ``total % world`` pieces one row longer)."""
    size, extra = divmod(total, ctx.world)
    start = ctx.rank * size + min(ctx.rank, extra)
    return start, start + size + (ctx.rank < extra)


def shard(batch: Mapping[str, Tensor], ctx: DistContext) -> dict[str, Tensor] | None:
    """This rank's rows of a global batch (``None``: fewer rows than processes, skip it)."""
    rows = next(iter(batch.values())).shape[0]
    if rows < ctx.world:
        return None
    return {k: torch.tensor_split(v, ctx.world)[ctx.rank] for k, v in batch.items()}


def all_sum(t: Tensor) -> Tensor:
    """``t`` summed over the ranks (a new tensor; ``t`` is not changed)."""
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def agree(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (one tiny broadcast)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


@torch.no_grad()
def broadcast_gates_(gates: list[nn.Parameter]) -> int:
    """Rank 0's gate values on every rank; the number of entries that differed on this rank
    (a corrupted or drifted replica is repaired, never trusted)."""
    if not gates:
        return 0
    flat = torch.cat([g.detach().reshape(-1) for g in gates])  # (E,)
    mine = flat.clone()
    dist.broadcast(flat, src=0)
    differ = int((mine != flat).sum())
    offset = 0
    for g in gates:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return differ


def gather_rng(ctx: DistContext) -> list[Tensor]:
    """Every rank's CPU RNG state, in rank order (on every rank)."""
    states: list[Any] = [None] * ctx.world
    dist.all_gather_object(states, torch.get_rng_state())
    return states


class LossModule(nn.Module):
    """``workload.forward_loss(model, batch)`` as a module, so that DDP wraps the whole loss
    (workloads read attributes of the model, such as ``hf_bert``'s teacher, that a DDP
    wrapper would hide). Returns ``{"loss": (), **sums}``."""

    def __init__(self, model: nn.Module, workload: Any) -> None:
        super().__init__()
        self.model = model
        self.workload = workload

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        out = self.workload.forward_loss(self.model, batch)
        return {"loss": out.loss, **out.sums}


PER_STEP = ("objective", "penalty", "lambda", "gamma")  # window keys that are not sums


class DataParallel:
    """The trainer's data-parallel side: the DDP wrapper (rebuilt after shrinks), the scaled
    loss, the window's all-reduce, the agreed stop and the gate broadcast."""

    def __init__(self, ctx: DistContext, model: nn.Module, workload: Any) -> None:
        self.ctx, self.model, self.workload = ctx, model, workload
        self.wrapped: nn.Module | None = None
        self.rebuilds, self.rebuild_seconds, self.gate_repairs = 0, 0.0, 0

    def invalidate(self) -> None:
        """Parameter shapes changed (a shrink, a restore): wrap again at the next step."""
        self.wrapped = None

    def loss(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """``(scaled loss, local sums, global mean loss)`` of this rank's rows."""
        if self.wrapped is None:
            t0 = time.perf_counter()
            self.wrapped = nn.parallel.DistributedDataParallel(
                LossModule(self.model, self.workload), find_unused_parameters=False
            )  # checks the shapes across the ranks and syncs from rank 0
            self.rebuilds += 1
            self.rebuild_seconds += time.perf_counter() - t0
        out = self.wrapped(batch)
        sums = {k: v for k, v in out.items() if k != "loss"}
        count = sums["count"]
        total = all_sum(count)  # ()
        switch = all_sum(sums["loss_sum"]) / total  # () the global mean loss
        return out["loss"] * (count * self.ctx.world / total), sums, switch

    def window(self, window: Mapping[str, Tensor]) -> dict[str, float]:
        """The window over every rank: sums added, per-step values averaged."""
        out = {}
        for k in sorted(window):  # the same order on every rank: one collective each
            total = float(all_sum(window[k]).item())
            out[k] = total / self.ctx.world if k in PER_STEP else total
        return out

    def stop(self, flag: bool, device: torch.device) -> bool:
        return agree(self.ctx.main and flag, device)

    def sync_gates(self, gates: list[nn.Parameter]) -> None:
        self.gate_repairs += broadcast_gates_(gates)

    def report(self) -> dict[str, Any]:
        return {
            "world_size": self.ctx.world,
            "backend": str(dist.get_backend()),
            "ddp_rebuilds": self.rebuilds,
            "ddp_rebuild_seconds": round(self.rebuild_seconds, 3),
            "gate_repairs": self.gate_repairs,
        }
