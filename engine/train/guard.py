"""The fidelity guard of a pruning stage: never end below the stage start by more than a
tolerance (``compression.max_metric_drop``, in metric points: 1.0 = one accuracy point).

A late stage cuts ranks in steps. Before each cut, and at the stage's end, the trainer
evaluates; :meth:`FidelityGuard.check` compares the validation metric ``m`` with the one at
the stage start ``m0``::

    within = 100 m >= 100 m0 - max_metric_drop

Within tolerance, the model is the smallest one known to be good: :meth:`accept` keeps a copy
of its parameters and optimizer state (the *snapshot*). Out of tolerance, :meth:`restore`
puts the snapshot back and the stage stops there, reporting ``target_reached: false``. The
first snapshot is the model at the stage start, so a stage never ends worse than it began by
more than the tolerance.

The snapshot lives in host memory and is written into every checkpoint (``guard/...``
tensors), so a resumed run restores exactly what the uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine.train import checkpoint as ckpt

__all__ = ["FidelityGuard", "POINTS"]

POINTS = 100.0  # metric points per unit of the metric (accuracy 0.95 = 95 points)


class FidelityGuard:
    """Reference, tolerance and the smallest good model of one stage."""

    def __init__(self, metric: str, max_drop: float) -> None:
        self.metric, self.max_drop = metric, float(max_drop)
        self.reference: float | None = None  # m0: the metric at the stage start
        self.accepted: dict[str, Any] = {}  # step, size and metric of the snapshot
        self.snapshot: dict[str, Tensor] = {}
        self.snapshot_meta: dict[str, Any] = {}

    # -- decisions -------------------------------------------------------------------------
    def floor(self) -> float | None:
        """The lowest metric within tolerance (``None`` before the reference is known)."""
        if self.reference is None:
            return None
        return self.reference - self.max_drop / POINTS

    def check(self, metrics: Mapping[str, float]) -> bool:
        """Whether ``metrics`` are within tolerance of the reference (no metric: yes)."""
        low = self.floor()
        value = metrics.get(self.metric)
        return low is None or value is None or value >= low - 1e-12

    # -- snapshots ---------------------------------------------------------------------------
    def accept(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Mapping[nn.Parameter, str],
        *,
        step: int,
        size: int,
        metrics: Mapping[str, float],
    ) -> None:
        """Keep the current model and optimizer state as the smallest good model."""
        if self.reference is None:
            self.reference = metrics.get(self.metric)
        tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
        opt_tensors, opt_meta = ckpt.optimizer_tensors(optimizer, names)
        tensors.update(opt_tensors)
        self.snapshot = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
        self.snapshot_meta = opt_meta
        self.accepted = {"step": step, "size": size, "metric": metrics.get(self.metric)}

    def restore(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Mapping[nn.Parameter, str],
    ) -> None:
        """Put the snapshot back (parameters take their snapshot shapes)."""
        if not self.snapshot:
            raise RuntimeError("the fidelity guard has no snapshot to restore")
        for p in model.parameters():  # gradients of the cut shapes would outlive the restore
            p.grad = None
        ckpt.load_model_state_(model, self.snapshot)
        groups = [dict(g) for g in optimizer.param_groups]  # keep the live learning rates
        ckpt.load_optimizer_state_(optimizer, names, self.snapshot, self.snapshot_meta)
        for group, live in zip(optimizer.param_groups, groups, strict=True):
            for key, value in live.items():
                if key != "params":
                    group[key] = value

    # -- checkpoints -------------------------------------------------------------------------
    def tensors(self) -> dict[str, Tensor]:
        return {f"guard/{k}": v for k, v in self.snapshot.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "max_drop": self.max_drop,
            "reference": self.reference,
            "accepted": self.accepted,
            "snapshot_meta": self.snapshot_meta,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> FidelityGuard:
        guard = cls(data["metric"], data["max_drop"])
        guard.reference = data["reference"]
        guard.accepted = dict(data["accepted"])
        guard.snapshot_meta = dict(data["snapshot_meta"])
        guard.snapshot = {
            k[len("guard/") :]: v for k, v in tensors.items() if k.startswith("guard/")
        }
        return guard
