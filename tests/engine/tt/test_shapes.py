"""Mode factorization (against brute force), rank resolution and the chain merges."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from engine.contract.reference import chain_full
from engine.tt.chain import merge, merge_backward, merge_macs
from engine.tt.shapes import bond_rank_bounds, factorize, resolve_modes, resolve_ranks
from tests.helpers.assertions import assert_close_rel


def brute_min_sum(n: int, d: int) -> int:
    """Least sum of d factors (>= 2 each) of n by exhaustive search; inf if none."""
    best = math.inf
    divisors = [k for k in range(2, n + 1) if n % k == 0]
    for combo in itertools.combinations_with_replacement(divisors, d):
        if math.prod(combo) == n:
            best = min(best, sum(combo))
    return best


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("n", [64, 96, 768, 1000, 1024, 3072])
def test_factorize_finds_the_least_sum_without_padding_when_it_is_best(n, d):
    f = factorize(n, d, max_padding=0.0)
    assert f.padded_size == n and len(f.modes) == d
    assert sum(f.modes) == brute_min_sum(n, d)
    assert list(f.modes) == sorted(f.modes)


def test_factorize_pads_awkward_sizes_and_reports_it():
    f = factorize(30522, 4)
    assert f.padded_size >= 30522 and f.padding == f.padded_size - 30522
    assert max(f.modes) <= 4 * min(f.modes)
    prime = factorize(769, 3)  # 769 is prime
    assert prime.padding > 0 and min(prime.modes) > 1


def test_factorize_score_is_minimal_over_the_padding_window():
    n, d = 1021, 3  # prime
    f = factorize(n, d, max_padding=0.05)
    best = min(brute_min_sum(p, d) * p / n for p in range(n, int(n * 1.05) + 1))
    assert sum(f.modes) * f.padded_size / n == pytest.approx(best)


def test_resolve_modes_validates_explicit_modes():
    assert resolve_modes(30522, (16, 20, 10, 10), name="row_modes").padding == 32000 - 30522
    with pytest.raises(ValueError, match="row_modes"):
        resolve_modes(30522, (16, 20, 10, 9), name="row_modes")
    with pytest.raises(ValueError, match="in_modes"):
        resolve_modes(12, (3, 0, 4), name="in_modes")


def test_rank_resolution_caps_at_the_bond_bounds():
    sizes = (12, 8, 8, 8, 8, 12)
    assert bond_rank_bounds(sizes) == (12, 96, 768, 96, 12)
    assert resolve_ranks(sizes, max_rank=30) == (1, 12, 30, 30, 30, 12, 1)
    assert resolve_ranks(sizes, max_rank=None, ranks=(2, 3, 4, 3, 2)) == (1, 2, 3, 4, 3, 2, 1)
    with pytest.raises(ValueError, match="ranks"):
        resolve_ranks(sizes, max_rank=None, ranks=(2, 3, 0, 3, 2))
    with pytest.raises(ValueError, match="max_rank"):
        resolve_ranks(sizes, max_rank=0)


@pytest.mark.parametrize("direction", ["ltr", "rtl"])
@pytest.mark.parametrize("a0,aK", [(1, 3), (4, 1), (2, 5)])
def test_merge_equals_full_tensor_and_backward_equals_autograd(direction, a0, aK):
    shapes = [(a0, 3, 4), (4, 5, 2), (2, 2, 6), (6, 3, aK)]
    cores = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    p, saved = merge(cores, direction)
    # reference: contract the chain with explicit boundary indices
    full = cores[0]
    for g in cores[1:]:
        full = torch.tensordot(full, g, dims=([full.dim() - 1], [0]))
    assert_close_rel(p, full.reshape(-1, aK), 1e-13, "merge")
    upstream = torch.randn_like(p)
    want = torch.autograd.grad(full.reshape(-1, aK), cores, upstream)
    got = merge_backward([c.detach() for c in cores], saved, upstream, direction)
    for g, w in zip(got, want, strict=True):
        assert_close_rel(g, w, 1e-12, "merge backward")


def test_merge_macs_counts_both_orders():
    shapes = [(1, 12, 12), (12, 8, 30), (30, 8, 30)]
    assert merge_macs(shapes, "ltr") == 12 * 12 * 8 * 30 + 96 * 30 * 8 * 30
    assert merge_macs(shapes, "rtl") == 12 * 8 * 30 * 8 * 30 + 1 * 12 * 12 * 64 * 30


def test_chain_full_matches_merge_for_boundary_ranks_one():
    cores = [torch.randn(1, 3, 2), torch.randn(2, 4, 1)]
    assert_close_rel(chain_full(cores).reshape(-1, 1), merge(cores, "ltr")[0], 1e-6, "full")
