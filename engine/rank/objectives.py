"""Scalarized training objectives of the two CoMERA stages
(docs/method.md#stage-objectives).

Early stage (linear scalarization)::

    J_early = L + gamma * R

Late stage (achievement scalarization with reference point ``(L*, S*)``)::

    lam = 1[ (L - L*) / L  <  (S - S*) / S ]          a 0/1 constant per step: no gradient
    J_late = loss_weight * L + gamma * R + lam * R + (1 - lam) * L

so ``grad J_late = (loss_weight + 1 - lam) grad L + (gamma + lam) grad R``: each step descends on
whichever objective is relatively further from its reference (the size gap measured with the exact
``S``, the step taken on its surrogate ``R``), plus the fixed augmentation ``loss_weight * L +
gamma * R``. Defaults ``gamma = 0.01`` and ``loss_weight = 0.1`` are the released code's constants.

Edge cases follow IEEE arithmetic: ``S = 0`` gives a size gap of ``-inf`` (or NaN when
``S* = 0`` too), so ``lam = 0`` and the step goes to the loss; ``L = 0`` gives a loss gap of
``-inf`` and ``lam = 1`` unless the size gap is ``-inf`` as well.

All functions stay on the tensors' device and never synchronise with the host, so they can run
inside a CUDA graph; the references may be Python numbers or () tensors (static graph buffers).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["early_objective", "late_switch", "late_objective"]


def early_objective(task_loss: Tensor, penalty: Tensor, gamma: float) -> Tensor:
    """``L + gamma * R``."""
    return task_loss + gamma * penalty


@torch.no_grad()
def late_switch(
    loss: Tensor, size: Tensor, loss_ref: float | Tensor, size_ref: float | Tensor
) -> Tensor:
    """``lam = 1[(L - L*)/L < (S - S*)/S]`` as a () float tensor of ``loss``'s dtype, no grad."""
    loss, size = loss.detach(), size.detach()
    loss_gap = (loss - loss_ref) / loss  # () relative distance of L above its reference
    size_gap = (size - size_ref) / size  # () relative distance of S above its reference
    return (loss_gap < size_gap).to(loss.dtype)  # ()


def late_objective(
    task_loss: Tensor,
    penalty: Tensor,
    size: Tensor,
    loss_ref: float | Tensor,
    size_ref: float | Tensor,
    *,
    gamma: float = 0.01,
    loss_weight: float = 0.1,
    switch_loss: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(J_late, lam)`` with ``J_late = loss_weight L + gamma R + lam R + (1 - lam) L``;
    ``lam`` compares ``switch_loss`` (default: ``task_loss``) with ``L*``."""
    lam = late_switch(task_loss if switch_loss is None else switch_loss, size, loss_ref, size_ref)
    objective = loss_weight * task_loss + gamma * penalty + lam * penalty + (1 - lam) * task_loss
    return objective, lam
