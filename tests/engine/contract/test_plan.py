"""The planner against brute force, and the cost model against counted multiply-adds."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from engine.contract.execute import TTLinearMeta, run_plan
from engine.contract.plan import (
    SIDE_CHOICES,
    CostWeights,
    Plan,
    TTLinearProblem,
    plan_cost,
    plan_tt_linear,
)
from engine.nn.functional import problem_for
from engine.tt.cores import init_cores

SHAPES = [
    ((12, 8, 8), (8, 8, 12), (1, 12, 30, 30, 30, 12, 1), 768, 768),
    ((12, 8, 8), (12, 16, 16), (1, 12, 30, 30, 30, 16, 1), 768, 3072),
    ((16, 16, 12), (8, 8, 12), (1, 16, 30, 30, 30, 12, 1), 3072, 768),
    ((5, 7), (2, 11), (1, 3, 4, 2, 1), 35, 22),
    ((5, 3, 4), (2, 7, 3), (1, 3, 4, 5, 4, 3, 1), 57, 40),
    ((3, 2, 5, 2), (2, 3, 3, 2), (1, 3, 5, 4, 6, 5, 4, 2, 1), 60, 33),
]
ROWS = [1, 2, 8, 32, 128, 1024, 4096, 65536]


def brute_force(problem: TTLinearProblem, weights: CostWeights) -> float:
    plans = [Plan("factored", i, o) for i, o in itertools.product(SIDE_CHOICES, repeat=2)]
    plans.append(Plan("dense"))
    return min(weights.score(plan_cost(problem, p)) for p in plans)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[3]}x{s[4]}")
@pytest.mark.parametrize("weights", [CostWeights(), CostWeights(0.0, 0.0), CostWeights(1e6, 1.0)])
def test_planner_choice_is_the_brute_force_minimum(shape, weights):
    in_modes, out_modes, ranks, n, m = shape
    chosen = set()
    for rows, bias, input_grad in itertools.product(ROWS, [True, False], [True, False]):
        p = TTLinearProblem(in_modes, out_modes, ranks, n, m, rows, bias, input_grad)
        plan = plan_tt_linear(p, weights)
        assert weights.score(plan_cost(p, plan)) == brute_force(p, weights)
        chosen.add(str(plan))
    assert len(chosen) >= 1


def test_planner_moves_from_sweep_to_merged_halves_as_rows_grow():
    in_modes, out_modes, ranks, n, m = SHAPES[1]
    macs_only = CostWeights(0.0, 0.0)
    small = plan_tt_linear(TTLinearProblem(in_modes, out_modes, ranks, n, m, 1), macs_only)
    large = plan_tt_linear(TTLinearProblem(in_modes, out_modes, ranks, n, m, 4096), macs_only)
    assert "sweep" in str(small)
    assert large.fused
    # the multiply-add ratios quoted for the MNLI shapes: nn.Linear (3 B N M) over TT
    for shape, ratio in ((SHAPES[0], 12.7), (SHAPES[1], 20.3)):
        p = TTLinearProblem(*shape, rows=4096)
        tt = plan_cost(p, plan_tt_linear(p)).macs
        assert 0.95 * ratio < 3 * 4096 * shape[3] * shape[4] / tt < 1.05 * ratio


def test_plans_are_cached():
    p = TTLinearProblem((5, 7), (2, 11), (1, 3, 4, 2, 1), 35, 22, 17)
    before = plan_tt_linear.cache_info().hits
    first = plan_tt_linear(p)
    assert plan_tt_linear(TTLinearProblem((5, 7), (2, 11), (1, 3, 4, 2, 1), 35, 22, 17)) is first
    assert plan_tt_linear.cache_info().hits >= before + 1


def _counted_macs(plan, shape, rows, bias, input_grad):
    in_modes, out_modes, ranks, n, m = shape
    core_shapes = [(ranks[k], s, ranks[k + 1]) for k, s in enumerate(in_modes + out_modes)]
    cores = [c.requires_grad_() for c in init_cores(core_shapes, 1.0, dtype=torch.float64)]
    gates = [torch.rand(r, dtype=torch.float64).add_(0.1).requires_grad_() for r in ranks[1:-1]]
    b = torch.randn(m, dtype=torch.float64, requires_grad=True) if bias else None
    x = torch.randn(rows, n, dtype=torch.float64, requires_grad=input_grad)
    meta = TTLinearMeta(in_modes, out_modes, n, m, 0.01)
    with FlopCounterMode(display=False) as counter:
        y = run_plan(x, cores, gates, b, meta, plan)
        forward = counter.get_total_flops()
        y.backward(torch.randn_like(y))
        total = counter.get_total_flops()
    problem = problem_for(x, cores, b, meta)
    return forward // 2, (total - forward) // 2, plan_cost(problem, plan)


@pytest.mark.parametrize("shape", SHAPES[3:], ids=lambda s: f"{s[3]}x{s[4]}")
@pytest.mark.parametrize("rows", [1, 6, 300])
@pytest.mark.parametrize(("bias", "input_grad"), [(True, True), (False, False), (True, False)])
def test_cost_model_equals_counted_multiply_adds(shape, rows, bias, input_grad):
    plans = [Plan("factored", i, o) for i, o in itertools.product(SIDE_CHOICES, repeat=2)]
    for plan in [*plans, Plan("dense")]:
        fwd, bwd, cost = _counted_macs(plan, shape, rows, bias, input_grad)
        assert (fwd, bwd) == (cost.forward_macs, cost.backward_macs), str(plan)


def test_cost_model_on_mnli_shape():
    for plan in [Plan("factored", "ltr", "rtl"), Plan("factored", "sweep", "sweep")]:
        fwd, bwd, cost = _counted_macs(plan, SHAPES[1], 3, True, True)
        assert (fwd, bwd) == (cost.forward_macs, cost.backward_macs)
