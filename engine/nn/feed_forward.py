"""``fc2(gelu(fc1(x)))`` for two ``TTLinear`` layers, fused when their plans allow.

When the planner runs both layers with both halves merged (the usual case), the block goes
through :class:`engine.contract.ffn.TTFFNFunction`: row block by row block, never holding a
(B, hidden) tensor, forward or backward. Otherwise (a swept or dense plan, ``"reference"``,
a bond cut to rank 0) it is ``fc2(fc1(x), activation="gelu")``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.contract.ffn import TTFFNFunction, block_rows
from engine.contract.plan import Plan, plan_tt_linear
from engine.nn.functional import parse_plan, problem_for
from engine.nn.premerge import premerged_ffn
from engine.nn.tt_linear import TTLinear

__all__ = ["tt_feed_forward"]


def _fused_plan(layer: TTLinear, x2: Tensor) -> Plan | None:
    cores = list(layer.cores)
    if any(c.numel() == 0 for c in cores):
        return None
    plan = parse_plan(layer.plan)
    if plan == "reference":
        return None
    if plan == "auto":
        plan = plan_tt_linear(problem_for(x2, cores, layer.bias, layer.meta))
    return plan if plan.fused else None


def tt_feed_forward(x: Tensor, fc1: TTLinear, fc2: TTLinear) -> Tensor:
    """``fc2(gelu(fc1(x)))`` for ``x (..., fc1.in_features)``."""
    if fc1.out_features != fc2.in_features:
        raise ValueError(
            f"fc1.out_features={fc1.out_features} != fc2.in_features={fc2.in_features}"
        )
    if x.dim() == 0 or x.shape[-1] != fc1.in_features:
        raise ValueError(f"input's last dimension must be {fc1.in_features}, got {tuple(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, fc1.in_features)  # (B, N)
    plan1 = _fused_plan(fc1, x2)
    plan2 = None
    if plan1 is not None:  # fc2's input is fc1's output: a stand-in with its rows and grad
        h_like = x2.new_empty(x2.shape[0], 0).requires_grad_(torch.is_grad_enabled())
        plan2 = _fused_plan(fc2, h_like)
    if plan1 is None or plan2 is None:
        y = fc2(fc1(x2), activation="gelu")  # (B, D)
    elif (y := premerged_ffn(x2, fc1, fc2, plan1, plan2, block_rows(fc1.out_features))) is None:
        p1 = [*fc1.cores, *fc1.gates]
        p2 = [*fc2.cores, *fc2.gates]
        spec1 = (fc1.meta, (plan1.input_side, plan1.output_side), len(p1))
        spec2 = (fc2.meta, (plan2.input_side, plan2.output_side), len(p2))
        y = TTFFNFunction.apply(
            x2, fc1.bias, fc2.bias, spec1, spec2, block_rows(fc1.out_features), *p1, *p2
        )  # (B, D)
    return y.reshape(*lead, fc2.out_features)
