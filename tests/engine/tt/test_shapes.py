"""Mode factorization (against brute force and the original exhaustive scan), rank resolution
and the chain merges."""

from __future__ import annotations

import itertools
import math
import random
import time
from functools import lru_cache

import pytest
import torch

from engine.contract.reference import chain_full
from engine.tt import shapes
from engine.tt.chain import merge, merge_backward, merge_macs
from engine.tt.shapes import (
    ModeFactorization,
    bond_rank_bounds,
    factorize,
    resolve_modes,
    resolve_ranks,
)
from tests.helpers.assertions import assert_close_rel

# Embedding table sizes of the Criteo Kaggle DLRM benchmark (the largest ones).
CRITEO_SIZES = (10131227, 8351593, 7046547, 5461306, 2202608, 286181)


# The original implementation (search verbatim, argument checks dropped): the reference.


@lru_cache(maxsize=4096)
def _reference_min_sum_factors(n: int, d: int, smallest: int) -> tuple[int, ...] | None:
    """Factors ``a_1 <= ... <= a_d`` of ``n`` (each >= ``smallest``) with the least sum."""
    if d == 1:
        return (n,) if n >= smallest else None
    best: tuple[int, ...] | None = None
    a = smallest
    while a**d <= n:
        if n % a == 0:
            rest = _reference_min_sum_factors(n // a, d - 1, a)
            if rest is not None and (best is None or a + sum(rest) < sum(best)):
                best = (a, *rest)
        a += 1
    return best


def _reference_factorize(size: int, d: int, *, max_padding: float = 0.1) -> ModeFactorization:
    """The original exhaustive scan over padded sizes (seconds for sizes of millions)."""
    smallest = 2 if size >= 2**d else 1
    best: tuple[float, tuple[int, ...]] | None = None
    limit = size + max(int(size * max_padding), 0)
    for p in range(size, limit + 1):
        bound = d * p ** (1.0 / d) * p / size
        if best is not None and bound >= best[0]:
            break
        factors = _reference_min_sum_factors(p, d, smallest)
        if factors is None:
            continue
        score = sum(factors) * p / size
        if best is None or score < best[0]:
            best = (score, factors)
    if best is None:  # no balanced factorization within the padding budget
        best = (0.0, _reference_min_sum_factors(size, d, 1) or (size,) + (1,) * (d - 1))
    return ModeFactorization(size, tuple(best[1]))


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _comparison_cases() -> list[tuple[int, int, float]]:
    """Edge cases plus seeded random sizes small enough for the reference to stay fast."""
    rng = random.Random(20240611)
    cases = [(n, d, mp) for n in range(1, 41) for d in range(1, 6) for mp in (0.0, 0.1)]
    for d in range(2, 9):  # around the 2**d switch between factors >= 1 and >= 2
        for n in (2**d - 1, 2**d, 2**d + 1, 3 * 2**d - 1, 10 * 2**d + 1):
            cases += [(n, d, 0.0), (n, d, 0.1)]
    for n in (768, 769, 1021, 3072, 30522, 65521, 65536, 99991, 2 * 49999):  # primes, 2*prime
        cases += [(n, d, mp) for d in range(2, 6) for mp in (0.0, 0.1)]
    for n, d in ((1000, 9), (3100, 9), (3100, 10), (6000, 11)):  # wide windows, (3100, 10):
        cases += [(n, d, 0.0), (n, d, 0.1)]  # no split into factors >= 2 at all
    cases += [(_log_uniform(rng, 41, 10**5), 2 + i % 4, 0.1) for i in range(200)]
    cases += [(_log_uniform(rng, 10**5, 10**6), 2 + i % 4, 0.1) for i in range(12)]
    for i in range(100):  # other padding budgets: narrow windows and wide ones
        mp = (0.0, 0.002, 0.02, 0.5)[i % 4]
        cases.append((_log_uniform(rng, 41, 10**5), 2 + i % 5, mp))
    return cases


@pytest.fixture(scope="module")
def reference_results() -> dict[tuple[int, int, float], ModeFactorization]:
    return {c: _reference_factorize(c[0], c[1], max_padding=c[2]) for c in _comparison_cases()}


@pytest.mark.parametrize("budget", ["default", 0, 10**9])
def test_factorize_equals_the_original_exhaustive_scan(reference_results, budget, monkeypatch):
    # budget 0: every wide window falls back to the size-by-size scan; 10**9: the branch and
    # bound always runs to the end; the default mixes both.
    if budget != "default":
        monkeypatch.setattr(shapes, "_BUDGET_PER_SIZE", budget)
    wrong = []
    for (n, d, mp), want in reference_results.items():
        got = factorize(n, d, max_padding=mp)
        if got != want:
            wrong.append(((n, d, mp), got.modes, want.modes))
    assert not wrong, f"{len(wrong)} of {len(reference_results)} differ, e.g. {wrong[:5]}"


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


def _assert_valid(f: ModeFactorization, n: int, d: int, max_padding: float) -> None:
    assert len(f.modes) == d and list(f.modes) == sorted(f.modes)
    assert n <= f.padded_size <= n + int(n * max_padding)


# CPU time of this process, not wall time: a loaded CI host deschedules the test, which says
# nothing of factorize's search


@pytest.mark.parametrize("d", [3, 4])
def test_factorize_is_fast_for_the_criteo_tables(d):
    for n in CRITEO_SIZES:
        start = time.process_time()
        f = factorize(n, d)
        elapsed = time.process_time() - start
        assert elapsed < 0.2, f"factorize({n}, {d}) took {elapsed:.3f} s"
        _assert_valid(f, n, d, 0.1)
        assert min(f.modes) > 1 and max(f.modes) <= 2 * min(f.modes)


@pytest.mark.parametrize("max_padding", [0.0, 0.1])
def test_factorize_is_fast_up_to_2_31_with_up_to_8_modes(max_padding):
    sizes = (2**31 - 1, 2**31, 1_000_000_007, 2 * 999_999_937, 1_102_701_600)
    for n, d in itertools.product(sizes, range(2, 9)):
        start = time.process_time()
        f = factorize(n, d, max_padding=max_padding)
        elapsed = time.process_time() - start
        assert elapsed < 0.2, f"factorize({n}, {d}, max_padding={max_padding}) took {elapsed:.3f}"
        if f.padding == 0:
            assert math.prod(f.modes) == n
        else:
            _assert_valid(f, n, d, max_padding)
