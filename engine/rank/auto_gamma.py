"""``gamma: "auto"``: an early-stage penalty weight that engages without hand tuning.

A fixed ``gamma`` in ``J = L + gamma R`` means nothing across models: the task gradient on the
gates and the penalty's differ by orders of magnitude from one model and data set to the
next, so a value that prunes one model never turns a gate off in another (or kills all of
them). :class:`AutoGamma` sets the weight from the gradients themselves. After each backward
it splits the gates' gradient into the task part and the penalty part
(:func:`engine.rank.importance.task_gate_grad`) and sets the next step's weight so that::

    gamma ||dR/dg|| = share * EMA(||dL/dg||)

the penalty's push on the gates is a set ``share`` of the task's (exponential moving average,
``beta = 0.9``, bias-corrected). With Adam, which normalizes each gate's step, this is what
decides whether an unimportant gate drifts to zero while an important one holds.

``share`` is :data:`SHARE0` (the penalty pushes with half the task's strength). Two things
keep this from pruning a model to death, as a penalty alone can (Adam moves every gate the
penalty dominates at the same speed, so they cross ``tau`` together):
:meth:`engine.rank.penalty.GateIndex.protect` exempts each bond's largest entries up to a
floor, and with a stage ``target_ratio`` the size follows the cubic bound of
:mod:`engine.rank.schedule` by gradual cuts (:mod:`engine.train.rank_control`), the penalty
having already shrunk the gates of the entries cut.

All work stays on the device with no host synchronisation (CUDA-graph safe: the tensors are
updated in place). The weight used by each step is logged as the ``gamma`` metric.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.rank.importance import task_gate_grad
from engine.rank.penalty import GateIndex

__all__ = ["AutoGamma", "SHARE0", "SHARE_MIN", "GAMMA_MAX", "BETA"]

SHARE0 = 0.5
SHARE_MIN = 1e-3
GAMMA_MAX = 1e4
BETA = 0.9  # EMA of the task gradient's norm ratio


class AutoGamma:
    """The self-tuning ``gamma`` of one early stage (see the module docstring)."""

    def __init__(self, index: GateIndex, *, share: float = SHARE0) -> None:
        self.index = index
        flat = index.values()
        kw = {"dtype": torch.float32, "device": flat.device}
        self.gamma = torch.zeros((), **kw)  # () the weight the next step uses
        self.share = torch.tensor(float(share), **kw)  # ()
        self.ema = torch.zeros((), **kw)  # () EMA of ||dL/dg|| / ||dR/dg||, biased
        self.steps = torch.zeros((), **kw)  # () updates so far (for the bias correction)

    @torch.no_grad()
    def update(self, loss_coef: Tensor | float = 1.0) -> None:
        """After ``(loss_coef L + gamma R).backward()``, before clipping: the next weight."""
        dr = self.index.penalty_grad()  # (E,)
        dl = task_gate_grad(self.index, loss_coef, self.gamma)  # (E,)
        norm_r = torch.linalg.vector_norm(dr).to(self.ema.dtype)  # ()
        ratio = torch.linalg.vector_norm(dl).to(self.ema.dtype) / norm_r.clamp(min=1e-30)
        ratio = torch.where(norm_r > 0, ratio, torch.zeros_like(ratio))  # nothing to prune
        self.ema.mul_(BETA).add_(ratio, alpha=1 - BETA)
        self.steps.add_(1)
        unbiased = self.ema / (1 - torch.pow(torch.full_like(self.steps, BETA), self.steps))
        self.gamma.copy_((self.share * unbiased).clamp(0.0, GAMMA_MAX))

    def pace(self, size: float, bound: float) -> float:
        """Host side, at a prune event of a stage with a target: halve the share while the
        size is below the bound (the penalty alone is shrinking the model faster than the
        schedule), double it back towards :data:`SHARE0` otherwise. Returns the new share."""
        value = float(self.share) * (0.5 if size < bound else 2.0)
        self.share.fill_(min(max(value, SHARE_MIN), SHARE0))
        return float(self.share)

    def state(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in ("gamma", "share", "ema", "steps")}

    def load(self, state: dict[str, float]) -> None:
        for k, v in state.items():
            getattr(self, k).fill_(v)
