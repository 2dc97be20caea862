"""Contraction plans for TT-linear: candidates, an exact cost model, and the planner.

A TT-linear with input modes ``n_1..n_d`` and output modes ``m_1..m_e`` computes
``y = x L R + b`` where ``L`` (N', r) merges the input cores and ``R`` (r, M') the output cores
(``r`` is the middle rank). Each *side* of the layer is executed one of three ways:

* ``ltr`` / ``rtl``: merge that side's cores into ``L`` or ``R`` (left-to-right or
  right-to-left; see :mod:`engine.tt.chain`) and apply it as one skinny GEMM;
* ``sweep``: contract the activation with that side's cores one core at a time.

A fourth, whole-layer candidate is ``dense``: rebuild ``W^T = L R`` and do one GEMM.

The cost model counts multiply-adds exactly as the executor issues them (forward and
backward, tested against a FLOP counter), the bytes of activations saved for backward, and
the number of GEMM launches. Plans are ranked by

    macs_total + kernel_overhead * kernels + bytes_weight * saved_bytes

where ``kernel_overhead`` prices a launch in multiply-adds (small problems are dominated by
launches, not arithmetic). The planner picks the cheapest plan and caches it per problem.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from engine.tt.chain import merge_macs

__all__ = [
    "TTLinearProblem",
    "Plan",
    "PlanCost",
    "CostWeights",
    "SIDE_CHOICES",
    "candidate_plans",
    "plan_cost",
    "plan_tt_linear",
]

Side = Literal["ltr", "rtl", "sweep"]
SIDE_CHOICES: tuple[Side, ...] = ("ltr", "rtl", "sweep")


@dataclass(frozen=True)
class TTLinearProblem:
    """Everything a plan depends on. ``ranks`` is the full vector ``(1, r_1, ..., 1)``."""

    in_modes: tuple[int, ...]
    out_modes: tuple[int, ...]
    ranks: tuple[int, ...]
    in_features: int
    out_features: int
    rows: int
    bias: bool = True
    input_grad: bool = True
    itemsize: int = 4

    @property
    def d(self) -> int:
        return len(self.in_modes)

    @property
    def mid_rank(self) -> int:
        return self.ranks[self.d]

    def in_core_shapes(self) -> list[tuple[int, int, int]]:
        r = self.ranks
        return [(r[k], n, r[k + 1]) for k, n in enumerate(self.in_modes)]

    def out_core_shapes(self) -> list[tuple[int, int, int]]:
        r, d = self.ranks, self.d
        return [(r[d + k], m, r[d + k + 1]) for k, m in enumerate(self.out_modes)]


@dataclass(frozen=True)
class Plan:
    """``kind='factored'`` uses the two side choices; ``kind='dense'`` rebuilds W."""

    kind: Literal["factored", "dense"]
    input_side: Side = "ltr"
    output_side: Side = "rtl"

    @property
    def fused(self) -> bool:
        """Both sides merged: run by the custom autograd function (fused bias gradient)."""
        return self.kind == "factored" and "sweep" not in (self.input_side, self.output_side)

    def __str__(self) -> str:
        return "dense" if self.kind == "dense" else f"{self.input_side}|{self.output_side}"


@dataclass(frozen=True)
class PlanCost:
    forward_macs: int
    backward_macs: int
    saved_elements: int
    kernels: int
    itemsize: int = 4

    @property
    def macs(self) -> int:
        return self.forward_macs + self.backward_macs

    @property
    def saved_bytes(self) -> int:
        return self.saved_elements * self.itemsize


@dataclass(frozen=True)
class CostWeights:
    """How the planner trades arithmetic, launches and saved memory.

    ``kernel_overhead`` is a launch priced in multiply-adds. The default comes from
    ``python -m bench.plan_calibration`` on the 2-core CI machine: a least-squares fit of
    measured step times to ``macs / rate + launches * cost`` over 5 shapes x 4 row counts x 10
    plans gave 77 GMAC/s and 12.9 us per launch, i.e. about 1e6 multiply-adds per launch.
    """

    kernel_overhead: float = 1.0e6
    bytes_weight: float = 0.0

    def score(self, cost: PlanCost) -> float:
        return (
            cost.macs + self.kernel_overhead * cost.kernels + self.bytes_weight * cost.saved_bytes
        )


def _sweep_in_steps(p: TTLinearProblem) -> list[int]:
    """MACs of each input-sweep step: ``B * n_k * rest_k * r_{k-1} * r_k``."""
    steps, rest = [], math.prod(p.in_modes)
    for a, n, b in p.in_core_shapes():
        rest //= n
        steps.append(p.rows * n * rest * a * b)
    return steps


def _sweep_out_steps(p: TTLinearProblem) -> list[int]:
    """MACs of each output-sweep step: ``B * prod(m_<k) * r_{k-1} * m_k * r_k``."""
    steps, done = [], 1
    for a, m, b in p.out_core_shapes():
        steps.append(p.rows * done * a * m * b)
        done *= m
    return steps


def _side_in(p: TTLinearProblem, side: Side) -> PlanCost:
    B, N, r = p.rows, p.in_features, p.mid_rank
    if side == "sweep":
        steps = _sweep_in_steps(p)
        fwd = sum(steps)
        bwd = 2 * fwd - (0 if p.input_grad else steps[0])
        shapes = p.in_core_shapes()
        saved = sum(s // b for s, (_, _, b) in zip(steps, shapes, strict=True))  # step inputs
        return PlanCost(fwd, bwd, saved, 0, p.itemsize)
    merge = merge_macs(p.in_core_shapes(), side)
    fwd = merge + B * N * r
    bwd = 2 * merge + B * N * r * (2 if p.input_grad else 1)
    return PlanCost(fwd, bwd, B * N, 0, p.itemsize)


def _side_out(p: TTLinearProblem, side: Side, fused_bias: bool) -> PlanCost:
    B, M, r = p.rows, p.out_features, p.mid_rank
    if side == "sweep":
        steps = _sweep_out_steps(p)
        fwd = sum(steps)
        shapes = p.out_core_shapes()
        saved = sum(s // (m * b) for s, (_, m, b) in zip(steps, shapes, strict=True))
        return PlanCost(fwd, 2 * fwd, saved, 0, p.itemsize)
    merge = merge_macs(p.out_core_shapes(), side)
    r_b = r + (1 if fused_bias else 0)  # the fused path carries the bias as an extra rank
    fwd = merge + B * r_b * M
    bwd = 2 * merge + B * r * M + B * r_b * M
    return PlanCost(fwd, bwd, B * r, 0, p.itemsize)


def _launches(p: TTLinearProblem, plan: Plan) -> int:
    """Op launches (forward + backward) the executor issues for ``plan``.

    The fused function applies all gates with three ops and does its own backward; composed
    plans pay autograd's per-op bookkeeping: five ops per gated core (threshold and multiply,
    then three back), three per merge step or skinny GEMM, six per swept core (a permuting
    copy and a GEMM, each with its backward).
    """
    d_in, d_out = p.d, len(p.out_modes)
    k = d_in + d_out
    if plan.fused:
        fwd = 4 + (d_in - 1) + (d_out - 1) + 2 + (2 if p.bias else 0)
        bwd = 5 + 2 * (d_in - 1) + 2 * (d_out - 1) + (k + 3) + (1 if p.input_grad else 0)
        return fwd + bwd
    total = 5 * (k - 1) + (2 if p.bias else 0)
    if plan.kind == "dense":
        return total + 3 * (d_in - 1 + d_out - 1 + 2)
    for side, n in ((plan.input_side, d_in), (plan.output_side, d_out)):
        total += 6 * n if side == "sweep" else 3 * (n - 1) + 3
    return total


def _add(a: PlanCost, b: PlanCost, kernels: int) -> PlanCost:
    return PlanCost(
        a.forward_macs + b.forward_macs,
        a.backward_macs + b.backward_macs,
        a.saved_elements + b.saved_elements,
        kernels,
        a.itemsize,
    )


def plan_cost(p: TTLinearProblem, plan: Plan) -> PlanCost:
    """Exact multiply-adds (forward, backward), saved elements and launches of ``plan``."""
    if plan.kind == "dense":
        ins, outs = p.in_core_shapes(), p.out_core_shapes()
        merges = merge_macs(ins, "ltr") + merge_macs(outs, "rtl")
        B, N, M, r = p.rows, p.in_features, p.out_features, p.mid_rank
        rebuild = N * r * M
        fwd = merges + rebuild + B * N * M
        bwd = 2 * (merges + rebuild) + B * N * M * (2 if p.input_grad else 1)
        return PlanCost(fwd, bwd, B * N + N * M, _launches(p, plan), p.itemsize)
    fused_bias = plan.fused and p.bias
    sides = _side_in(p, plan.input_side), _side_out(p, plan.output_side, fused_bias)
    return _add(*sides, _launches(p, plan))


def candidate_plans() -> list[Plan]:
    """Every plan the executor can run: 3 x 3 side combinations plus ``dense``."""
    combos = itertools.product(SIDE_CHOICES, SIDE_CHOICES)
    return [Plan("factored", i, o) for i, o in combos] + [Plan("dense")]


@lru_cache(maxsize=8192)
def plan_tt_linear(problem: TTLinearProblem, weights: CostWeights = CostWeights()) -> Plan:
    """The cheapest candidate under ``weights`` (ties: fewer saved bytes, then order)."""
    best: tuple[float, int, int, Plan] | None = None
    for i, plan in enumerate(candidate_plans()):
        cost = plan_cost(problem, plan)
        key = (weights.score(cost), cost.saved_elements, i, plan)
        if best is None or key[:3] < best[:3]:
            best = key
    assert best is not None
    return best[3]
