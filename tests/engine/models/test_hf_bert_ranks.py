"""Rank allocation (engine.models.hf_bert.ranks) against brute force and direct counts."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from engine.models.hf_bert.ranks import (
    LayerProfile,
    allocate_ranks,
    depth_weighted,
    tt_params_at_rank,
    uniform_rank,
)
from engine.nn.tt_linear import TTLinear


def profiles(step_costs, weights, top: int = 5, seed: int = 0) -> list[LayerProfile]:
    """Layers with random descending energies; rank ``r`` costs ``r * step`` entries."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (step, w) in enumerate(zip(step_costs, weights, strict=True)):
        energy = torch.rand(top + 2, generator=g, dtype=torch.float64).sort(descending=True).values
        out.append(LayerProfile(f"l{i}", energy, tuple(r * step for r in range(top + 1)), w))
    return out


def distortion(ps, ranks) -> float:
    return sum(p.weight * p.left_out(ranks[p.name]) for p in ps)


def brute_force(ps, budget):
    """The least modelled distortion over every rank assignment within the budget."""
    best = None
    for combo in itertools.product(*[range(1, p.max_rank + 1) for p in ps]):
        ranks = {p.name: r for p, r in zip(ps, combo, strict=True)}
        if sum(p.costs[r] for p, r in zip(ps, combo, strict=True)) <= budget:
            d = distortion(ps, ranks)
            best = d if best is None else min(best, d)
    return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("steps_of_budget", [3, 6, 9, 12])
def test_greedy_allocation_is_optimal_when_every_step_costs_the_same(seed, steps_of_budget):
    # equal step costs and decreasing energies: the greedy exchange argument holds exactly
    ps = profiles([10, 10, 10], [1.0, 3.0, 0.5], seed=seed)
    budget = 10 * steps_of_budget
    ranks = allocate_ranks(ps, budget)
    assert sum(p.costs[ranks[p.name]] for p in ps) <= budget
    assert distortion(ps, ranks) == pytest.approx(brute_force(ps, budget), rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_allocation_with_unequal_costs_fits_and_is_near_the_optimum(seed):
    ps = profiles([7, 11, 16], [1.0, 2.0, 4.0], seed=seed)
    budget = 120
    ranks = allocate_ranks(ps, budget)
    assert sum(p.costs[ranks[p.name]] for p in ps) <= budget
    best = brute_force(ps, budget)
    # the greedy may miss the knapsack's last step; never by more than one step's worth
    worst_step = max(p.weight * float(p.energy[0] / p.energy.sum()) for p in ps)
    assert best <= distortion(ps, ranks) <= best + worst_step


def test_uniform_rank_is_the_largest_common_rank_within_the_budget():
    ps = profiles([10, 20, 30], [1.0, 1.0, 1.0])
    for budget in (60, 119, 120, 180, 10_000):
        want = max([r for r in range(1, 6) if 60 * r <= budget] or [1])
        assert uniform_rank(ps, budget) == want


@pytest.mark.parametrize("d, shape", [(1, (24, 40)), (2, (24, 40)), (2, (36, 16))])
def test_tt_params_at_rank_counts_the_cores_of_a_tt_svd(d, shape):
    dense = nn.Linear(*shape)
    for rank in (1, 3, 7, 50):
        layer = TTLinear.from_linear(dense, max_rank=rank, d=d)
        assert len(layer.cores) == 2 * d
        assert tt_params_at_rank(layer, rank) == sum(c.numel() for c in layer.cores)


def test_depth_gain_scales_each_block_and_moves_the_budget_up_the_stack():
    base = profiles([3] * 4, [1.0] * 4, top=5, seed=1)
    named = [
        LayerProfile(
            f"encoder.layer.{i}.attention.self.query", p.energy, p.costs, p.weight * (i + 1)
        )
        for i, p in enumerate(base)
    ] + [LayerProfile("pooler", base[0].energy, base[0].costs, 0.5)]
    scaled = depth_weighted(named, 3.0)
    assert [p.weight for p in scaled] == [1.0, 2 * 3.0, 3 * 9.0, 4 * 27.0, 0.5]
    assert all(
        torch.equal(a.energy, b.energy) and a.costs == b.costs
        for a, b in zip(named, scaled, strict=True)
    )
    assert [p.weight for p in depth_weighted(named, 1.0)] == [p.weight for p in named]
    # the same layers in every block: a gain above 1 never gives a later block less rank
    same = [
        LayerProfile(f"encoder.{i}.ffn.fc1", base[0].energy, base[0].costs, 1.0) for i in range(4)
    ]
    ranks = allocate_ranks(depth_weighted(same, 2.0), budget=3 * 10)
    got = [ranks[f"encoder.{i}.ffn.fc1"] for i in range(4)]
    assert got == sorted(got) and got[-1] > got[0]
