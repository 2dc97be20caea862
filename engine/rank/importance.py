"""Loss-aware importance of rank-gate entries: the first-order Taylor score
(docs/method.md#loss-aware-importance).

Cutting entry ``e`` (gate value ``g_e``) sets ``g_e`` to 0; to first order the task loss
changes by ``-g_e dL/dg_e``. :class:`GateImportance` averages ``|g_e dL/dg_e|`` over the
batches since its last :meth:`~GateImportance.reset` (Molchanov et al., 2019, "Importance
estimation for neural network pruning", score on gates), which the gradual pruner divides by
the parameters each entry controls to cut what costs least per parameter saved.

Only the task loss ``L`` counts, not the penalty: after a backward of ``J = a L + b R`` the
gates hold ``a dL/dg + b dR/dg``, and ``dR/dg`` is known in closed form
(:meth:`engine.rank.penalty.GateIndex.penalty_grad`), so::

    dL/dg = (grad_g J - b dR/dg) / a

Read the gradients before clipping. Everything stays on the gates' device with no host
synchronisation (CUDA-graph safe); the sums are float64 so long windows lose nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.rank.penalty import GateIndex

__all__ = ["GateImportance", "task_gate_grad"]


def task_gate_grad(
    index: GateIndex, loss_coef: Tensor | float, penalty_coef: Tensor | float
) -> Tensor:
    """``dL/dg`` (E,) from the gates' gradient of ``J = loss_coef L + penalty_coef R``."""
    return (index.grads() - penalty_coef * index.penalty_grad()) / loss_coef  # (E,)


class GateImportance:
    """Running mean of ``|g dL/dg|`` per gate entry since the last :meth:`reset`."""

    def __init__(self, index: GateIndex) -> None:
        self.index = index
        self.reset()

    def reset(self) -> None:
        """Start a new window (after a cut or a shrink). In place while the number of
        entries is the same, so a captured CUDA graph keeps updating these very tensors."""
        flat = self.index.values()
        sums = getattr(self, "sums", None)
        if sums is not None and sums.shape == flat.shape and sums.device == flat.device:
            self.sums.zero_()
            self.count.zero_()
            return
        self.sums = torch.zeros(flat.shape, dtype=torch.float64, device=flat.device)  # (E,)
        self.count = torch.zeros((), dtype=torch.long, device=flat.device)  # ()

    @torch.no_grad()
    def update(self, loss_coef: Tensor | float = 1.0, penalty_coef: Tensor | float = 0.0) -> None:
        """Add one batch; call after ``J.backward()`` and before clipping."""
        dl = task_gate_grad(self.index, loss_coef, penalty_coef)  # (E,)
        self.sums.add_((self.index.values() * dl).abs().to(torch.float64))
        self.count.add_(1)

    def scores(self) -> Tensor:
        """Mean ``|g dL/dg|`` (E,) over the window; zeros when it is empty."""
        return self.sums / self.count.clamp(min=1)  # (E,)

    def state(self) -> dict[str, Tensor]:
        return {"sums": self.sums, "count": self.count}

    def load(self, state: dict[str, Tensor]) -> None:
        """Restore a saved window; one of another length (the entries changed) starts anew."""
        if state["sums"].shape != self.sums.shape:
            self.reset()
            return
        self.sums.copy_(state["sums"])
        self.count.copy_(state["count"])
