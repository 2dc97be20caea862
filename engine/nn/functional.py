"""Functional TT-linear: plan selection around :mod:`engine.contract`.

``plan`` may be ``"auto"`` (the planner's choice for this row count), a plan name such as
``"ltr|rtl"``, ``"sweep|sweep"`` or ``"dense"``, a :class:`~engine.contract.plan.Plan`, or
``"reference"``: autograd through the dense reconstruction, the test oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.contract.execute import ACTIVATIONS, TTLinearMeta, run_plan
from engine.contract.plan import Plan, TTLinearProblem, candidate_plans, plan_tt_linear
from engine.contract.reference import tt_linear_reference

__all__ = ["tt_linear", "parse_plan", "problem_for", "PLAN_NAMES"]

PLAN_NAMES: dict[str, Plan] = {str(p): p for p in candidate_plans()}


def parse_plan(plan: str | Plan) -> Plan | str:
    """``"auto"`` / ``"reference"`` pass through; names map to :class:`Plan`."""
    if isinstance(plan, Plan) or plan in ("auto", "reference"):
        return plan
    if plan not in PLAN_NAMES:
        choices = ", ".join(["auto", "reference", *PLAN_NAMES])
        raise ValueError(f"plan must be one of {choices}; got {plan!r}")
    return PLAN_NAMES[plan]


def tt_linear(
    x: Tensor,
    cores: Sequence[Tensor],
    gates: Sequence[Tensor],
    bias: Tensor | None,
    meta: TTLinearMeta,
    plan: str | Plan = "auto",
    activation: str | None = None,
) -> Tensor:
    """y (..., M) = act(x) (..., N) W^T + b for the gated TT weight given by ``cores``/``gates``.

    ``activation`` (None or ``"gelu"``) is applied to ``x`` first; the fused plan then keeps
    ``x`` for backward instead of ``act(x)`` (see :mod:`engine.contract.execute`).
    """
    if x.dim() == 0 or x.shape[-1] != meta.in_features:
        raise ValueError(
            f"input's last dimension must be in_features={meta.in_features}, got {tuple(x.shape)}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, meta.in_features)  # (B, N)  view for contiguous x
    cores, gates = list(cores), list(gates)
    if any(c.numel() == 0 for c in cores):  # a bond was cut to rank 0: W is exactly zero
        # the empty cores and gates, and an empty slice of the input, still take part (an
        # exact 0): every parameter, the layers below this one included, gets a gradient
        # (data-parallel training needs one from each, every step)
        touch = sum(t.sum() for t in (*cores, *gates, x2[:0]))  # () 0.0
        y = x2.new_zeros(x2.shape[0], meta.out_features) + touch  # (B, M)
        return (y + bias if bias is not None else y).reshape(*lead, meta.out_features)
    plan = parse_plan(plan)
    if plan == "reference":
        d = len(meta.in_modes)
        a2 = F.gelu(x2) if activation == "gelu" else x2  # (B, N)
        y = tt_linear_reference(
            a2, cores, gates, bias, meta.tau, meta.in_features, meta.out_features, d
        )
        return y.reshape(*lead, meta.out_features)
    if plan == "auto":
        plan = plan_tt_linear(problem_for(x2, cores, bias, meta))
    y = run_plan(x2, cores, gates, bias, meta, plan, activation)  # (B, M)
    return y.reshape(*lead, meta.out_features)


def problem_for(
    x2: Tensor, cores: Sequence[Tensor], bias: Tensor | None, meta: TTLinearMeta
) -> TTLinearProblem:
    """The planner's key for a call: shapes, current ranks, rows, bias and grad needs."""
    ranks = (1, *(int(c.shape[-1]) for c in cores[:-1]), 1)
    return TTLinearProblem(
        in_modes=meta.in_modes,
        out_modes=meta.out_modes,
        ranks=ranks,
        in_features=meta.in_features,
        out_features=meta.out_features,
        rows=int(x2.shape[0]),
        bias=bias is not None,
        input_grad=bool(x2.requires_grad and torch.is_grad_enabled()),
        itemsize=x2.element_size(),
    )
