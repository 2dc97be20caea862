"""Tests for engine.tt.decompose (TT-SVD, rounding, layer layouts)."""

from __future__ import annotations

import math
import string

import pytest
import torch

from engine.tt.decompose import embedding_to_ttm, matrix_to_tt, tt_round, tt_svd, tt_to_full

DT = torch.float64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rand_chain(shape, ranks, seed=0):
    """Random TT chain with cores (r_{k-1}, s_k, r_k)."""
    g = _gen(seed)
    return [
        torch.randn(ranks[k], s, ranks[k + 1], generator=g, dtype=DT) for k, s in enumerate(shape)
    ]


def _einsum_full(cores):
    """Independent reconstruction: one einsum over the whole chain."""
    up, low = string.ascii_uppercase, string.ascii_lowercase
    terms = [f"{up[k]}{low[k]}{up[k + 1]}" for k in range(len(cores))]
    out = low[: len(cores)]
    return torch.einsum(",".join(terms) + "->" + out, *cores).reshape([c.shape[1] for c in cores])


def _ranks(cores):
    return [c.shape[0] for c in cores] + [cores[-1].shape[-1]]


def _rel_err(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def _n_params(cores):
    return sum(c.numel() for c in cores)


def _tt_inner(a, b):
    """<A, B> of two chains without forming either tensor."""
    acc = torch.ones(1, 1, dtype=DT)  # (ra, rb)
    for ga, gb in zip(a, b, strict=True):
        acc = torch.einsum("ab,asc,bsd->cd", acc, ga, gb)
    return float(acc.squeeze())


CASES = [
    ((4, 5, 3, 6), (1, 2, 3, 2, 1)),
    ((3, 4, 5), (1, 3, 2, 1)),
    ((2, 3, 2, 3, 2), (1, 2, 4, 3, 2, 1)),
    ((7, 9), (1, 3, 1)),
]


@pytest.mark.parametrize(("shape", "ranks"), CASES)
def test_tt_to_full_matches_einsum(shape, ranks):
    cores = _rand_chain(shape, ranks, seed=1)
    full = tt_to_full(cores)
    assert full.shape == shape
    assert torch.allclose(full, _einsum_full(cores), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("shape", "ranks"), CASES)
def test_tt_svd_recovers_known_chain(shape, ranks):
    full = _einsum_full(_rand_chain(shape, ranks, seed=2))
    for max_rank in (None, max(ranks), max(ranks) + 3):
        cores = tt_svd(full, max_rank=max_rank)
        assert _rel_err(_einsum_full(cores), full) <= 1e-8
    cores = tt_svd(full, max_rank=max(ranks) + 3, tol=1e-10)
    assert _ranks(cores) == list(ranks)
    assert _rel_err(_einsum_full(cores), full) <= 1e-8
    assert all(c.dtype == DT for c in cores)


def test_tt_svd_ranks_bounded_by_unfoldings():
    full = torch.randn(2, 3, 50, generator=_gen(3), dtype=DT)
    cores = tt_svd(full, max_rank=100)
    assert _ranks(cores) == [1, 2, 6, 1]
    assert _rel_err(tt_to_full(cores), full) <= 1e-12
    cores = tt_svd(full, max_rank=[2, 4])
    assert _ranks(cores) == [1, 2, 4, 1]


@pytest.mark.parametrize("tol", [0.05, 0.3, 0.6])
def test_tt_svd_tol_bound_on_random_tensor(tol):
    full = torch.randn(5, 6, 7, 8, generator=_gen(4), dtype=DT)
    cores = tt_svd(full, tol=tol)
    assert _rel_err(tt_to_full(cores), full) <= tol


def test_tt_svd_tol_compresses_noisy_low_rank():
    low = _einsum_full(_rand_chain((6, 7, 8, 9), (1, 3, 4, 3, 1), seed=5))
    noise = torch.randn(low.shape, generator=_gen(6), dtype=DT)
    full = low + 0.05 * noise * low.norm() / noise.norm()  # full rank, compressible
    cores = tt_svd(full, tol=0.3)
    assert _rel_err(tt_to_full(cores), full) <= 0.3
    assert _n_params(cores) < full.numel()


def test_tt_svd_max_rank_is_optimal_for_matrices():
    a = torch.randn(12, 9, generator=_gen(7), dtype=DT)
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    for r in (1, 3, 5, 9):
        cores = tt_svd(a, max_rank=r)
        best = (u[:, :r] * s[:r]) @ vh[:r]
        assert _ranks(cores) == [1, r, 1]
        assert torch.allclose(tt_to_full(cores), best, atol=1e-10)


def test_tt_svd_tol_picks_minimal_rank_for_matrices():
    a = torch.randn(10, 8, generator=_gen(8), dtype=DT)
    s = torch.linalg.svdvals(a)
    tol = 0.4
    r = _ranks(tt_svd(a, tol=tol))[1]
    tail = lambda k: float(s[k:].norm())  # noqa: E731
    assert tail(r) <= tol * float(a.norm()) < tail(r - 1)


def test_tt_svd_edge_cases():
    v = torch.arange(5, dtype=DT)
    (core,) = tt_svd(v, tol=0.1)
    assert core.shape == (1, 5, 1) and torch.equal(core.reshape(5), v)
    zeros = tt_svd(torch.zeros(3, 4, 5, dtype=DT), tol=0.1)
    assert _ranks(zeros) == [1, 1, 1, 1] and not tt_to_full(zeros).any()
    ints = tt_svd(torch.arange(24).reshape(2, 3, 4))
    assert ints[0].dtype == torch.float64
    assert torch.allclose(tt_to_full(ints), torch.arange(24, dtype=DT).reshape(2, 3, 4))


def test_tt_svd_float32_keeps_dtype():
    full = _einsum_full(_rand_chain((4, 5, 6), (1, 2, 3, 1), seed=9))
    cores = tt_svd(full.float(), tol=1e-5)
    assert all(c.dtype == torch.float32 for c in cores)
    assert _ranks(cores) == [1, 2, 3, 1]
    assert _rel_err(tt_to_full(cores).double(), full) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_tt_svd_fixes_the_signs_of_its_cores(dtype):
    """Each core but the last, unfolded to (r_{k-1} s_k, r_k), has every column's largest
    entry real and positive; so T and -T share every core but the last, which flips, and
    the chain still rebuilds T (LAPACK alone leaves the signs to its code path)."""
    g = _gen(4)
    full = torch.randn(4, 5, 3, 6, generator=g, dtype=DT)
    if dtype.is_complex:
        full = torch.complex(full, torch.randn(4, 5, 3, 6, generator=g, dtype=DT))
    for cores in (tt_svd(full, max_rank=3), tt_round(_rand_chain((4, 5, 6), (1, 4, 4, 1)), 2)):
        for core in cores[:-1]:
            flat = core.reshape(-1, core.shape[-1])  # (r_{k-1} s_k, r_k)
            pivot = flat.gather(0, flat.abs().argmax(0, keepdim=True))  # (1, r_k)
            assert torch.all(pivot.real > 0)
            assert not pivot.is_complex() or torch.all(pivot.imag.abs() < 1e-12)
    a, b = tt_svd(full, tol=1e-10), tt_svd(-full, tol=1e-10)
    assert all(torch.allclose(x, y, atol=1e-12) for x, y in zip(a[:-1], b[:-1], strict=True))
    assert torch.allclose(a[-1], -b[-1], atol=1e-12)
    assert _rel_err(tt_to_full(a), full) <= 1e-10


def _block_sum(a, b):
    """Chain of A + B via block-diagonal cores (ranks add)."""
    out = []
    n = len(a)
    for k, (ga, gb) in enumerate(zip(a, b, strict=True)):
        if k == 0:
            out.append(torch.cat([ga, gb], dim=2))
        elif k == n - 1:
            out.append(torch.cat([ga, gb], dim=0))
        else:
            ra0, s, ra1 = ga.shape
            rb0, _, rb1 = gb.shape
            g = torch.zeros(ra0 + rb0, s, ra1 + rb1, dtype=ga.dtype)
            g[:ra0, :, :ra1] = ga
            g[ra0:, :, ra1:] = gb
            out.append(g)
    return out


def _zero_pad_ranks(cores, extra):
    out = []
    for k, g in enumerate(cores):
        r0, s, r1 = g.shape
        p0 = 0 if k == 0 else extra
        p1 = 0 if k == len(cores) - 1 else extra
        padded = torch.zeros(r0 + p0, s, r1 + p1, dtype=g.dtype)
        padded[:r0, :, :r1] = g
        out.append(padded)
    return out


@pytest.mark.parametrize(("shape", "ranks"), CASES)
def test_tt_round_recovers_inflated_ranks(shape, ranks):
    a = _rand_chain(shape, ranks, seed=10)
    full = _einsum_full(a)
    doubled = _block_sum(a, [0.5 * a[0], *a[1:]])  # A + 0.5 A, ranks 2r
    assert _ranks(doubled)[1:-1] == [2 * r for r in ranks[1:-1]]
    rounded = tt_round(doubled, tol=1e-10)
    assert _ranks(rounded) == list(ranks)
    assert _rel_err(_einsum_full(rounded), 1.5 * full) <= 1e-10
    rounded = tt_round(_zero_pad_ranks(a, 3), tol=1e-10)
    assert _ranks(rounded) == list(ranks)
    assert _rel_err(_einsum_full(rounded), full) <= 1e-10


def test_tt_round_matches_tt_svd_of_full():
    a = _rand_chain((4, 5, 3, 6), (1, 3, 4, 3, 1), seed=11)
    full = _einsum_full(a)
    for kw in ({"max_rank": 2}, {"max_rank": [1, 2, 2]}, {"tol": 0.2}):
        via_round = tt_to_full(tt_round(a, **kw))
        via_svd = tt_to_full(tt_svd(full, **kw))
        assert _rel_err(via_round, via_svd) <= 1e-9
    rounded = tt_round(a, tol=0.2)
    assert _rel_err(tt_to_full(rounded), full) <= 0.2


def test_tt_round_never_forms_full_tensor():
    a = _rand_chain((10,) * 20, (1,) + (3,) * 19 + (1,), seed=12)  # 10^20 entries
    rounded = tt_round(_block_sum(a, a), tol=1e-8)
    assert _ranks(rounded) == _ranks(a)
    na, nr, cross = _tt_inner(a, a), _tt_inner(rounded, rounded), _tt_inner(a, rounded)
    err2 = nr - 4 * cross + 4 * na  # ||R - 2A||^2
    assert abs(err2) <= 1e-6 * 4 * na


def _linear_wt(cores, in_modes, out_modes):
    """Wt (N, M) from 2d TT-linear cores via the documented layout."""
    return _einsum_full(cores).reshape(math.prod(in_modes), math.prod(out_modes))


def test_matrix_to_tt_roundtrip():
    in_modes, out_modes = (2, 3, 4), (3, 2, 2)
    ranks = (1, 2, 3, 4, 3, 2, 1)
    true = _rand_chain(in_modes + out_modes, ranks, seed=13)
    wt = _linear_wt(true, in_modes, out_modes)  # (24, 12)
    weight = wt.T.contiguous()  # torch (out, in)
    cores = matrix_to_tt(weight, in_modes, out_modes, tol=1e-10)
    assert [c.shape[1] for c in cores] == list(in_modes + out_modes)
    assert _ranks(cores) == list(ranks)
    assert _rel_err(_linear_wt(cores, in_modes, out_modes), wt) <= 1e-8
    x = torch.randn(5, 24, generator=_gen(14), dtype=DT)
    y = x @ _linear_wt(cores, in_modes, out_modes)
    assert torch.allclose(y, torch.nn.functional.linear(x, weight), atol=1e-9)


@pytest.mark.parametrize(
    ("out_f", "in_f", "in_modes", "out_modes"),
    [(12, 30, (4, 8), (3, 4)), (10, 32, (4, 8), (3, 4)), (7, 29, (2, 4, 4), (2, 2, 2))],
)
def test_matrix_to_tt_padding(out_f, in_f, in_modes, out_modes):
    weight = torch.randn(out_f, in_f, generator=_gen(15), dtype=DT)
    cores = matrix_to_tt(weight, in_modes, out_modes)
    wt = _linear_wt(cores, in_modes, out_modes)
    assert wt.shape == (math.prod(in_modes), math.prod(out_modes))
    assert _rel_err(wt[:in_f, :out_f], weight.T) <= 1e-10
    assert float(torch.linalg.vector_norm(wt[in_f:])) <= 1e-10  # padded rows (may be empty)
    assert float(torch.linalg.vector_norm(wt[:, out_f:])) <= 1e-10


def _ttm_table(cores):
    """E (V, D) from TTM cores (r, n, m, r) via one einsum."""
    k_dims = len(cores)
    up = string.ascii_uppercase
    rows, cols = "abcdef"[:k_dims], "ghijkl"[:k_dims]
    terms = [f"{up[k]}{rows[k]}{cols[k]}{up[k + 1]}" for k in range(k_dims)]
    e = torch.einsum(",".join(terms) + "->" + rows + cols, *cores)
    return e.reshape(math.prod(c.shape[1] for c in cores), math.prod(c.shape[2] for c in cores))


def _rand_ttm(row_modes, col_modes, ranks, seed):
    g = _gen(seed)
    return [
        torch.randn(ranks[k], n, m, ranks[k + 1], generator=g, dtype=DT)
        for k, (n, m) in enumerate(zip(row_modes, col_modes, strict=True))
    ]


def test_embedding_to_ttm_roundtrip():
    row_modes, col_modes, ranks = (2, 3, 4), (2, 2, 3), (1, 3, 4, 1)
    true = _rand_ttm(row_modes, col_modes, ranks, seed=16)
    table = _ttm_table(true)  # (24, 12)
    cores = embedding_to_ttm(table, row_modes, col_modes, tol=1e-10)
    assert [tuple(c.shape[1:3]) for c in cores] == list(zip(row_modes, col_modes, strict=True))
    assert [c.shape[0] for c in cores] + [1] == list(ranks)
    assert _rel_err(_ttm_table(cores), table) <= 1e-8


def test_embedding_to_ttm_padding():
    row_modes, col_modes = (3, 4, 2), (2, 4)
    table = torch.randn(20, 7, generator=_gen(17), dtype=DT)
    with pytest.raises(ValueError, match="col_modes"):
        embedding_to_ttm(table, row_modes, col_modes)
    row_modes, col_modes = (4, 6), (2, 4)
    cores = embedding_to_ttm(table, row_modes, col_modes)
    e = _ttm_table(cores)  # (24, 8)
    assert _rel_err(e[:20, :7], table) <= 1e-10
    assert float(e[20:].abs().max()) <= 1e-10 and float(e[:, 7:].abs().max()) <= 1e-10


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: tt_svd(torch.ones(2, 3), max_rank=0), "max_rank"),
        (lambda: tt_svd(torch.ones(2, 3, 4), max_rank=[2, 0]), "max_rank"),
        (lambda: tt_svd(torch.ones(2, 3, 4), max_rank=[2, 2, 2]), "max_rank"),
        (lambda: tt_svd(torch.ones(2, 3), tol=-0.1), "tol"),
        (lambda: tt_svd(torch.ones(2, 3), tol=float("nan")), "tol"),
        (lambda: tt_svd(torch.ones(())), "tensor"),
        (lambda: tt_round([torch.ones(2, 3, 1)]), "cores"),
        (lambda: tt_round([torch.ones(1, 3, 2), torch.ones(3, 3, 1)]), "cores"),
        (lambda: tt_round(_rand_chain((2, 3), (1, 2, 1)), max_rank=-1), "max_rank"),
        (lambda: tt_round(_rand_chain((2, 3), (1, 2, 1)), tol=-1.0), "tol"),
        (lambda: tt_to_full([torch.ones(1, 3, 2)]), "cores"),
        (lambda: matrix_to_tt(torch.ones(12, 30), (4, 7), (3, 4)), "in_modes"),
        (lambda: matrix_to_tt(torch.ones(13, 30), (4, 8), (3, 4)), "out_modes"),
        (lambda: matrix_to_tt(torch.ones(12, 32), (4, 8), (12,)), "in_modes and out_modes"),
        (lambda: matrix_to_tt(torch.ones(12, 32), (4, 0, 8), (3, 4)), "in_modes"),
        (lambda: matrix_to_tt(torch.ones(12, 32), (4, 8), (3, 4), max_rank=[2]), "max_rank"),
        (lambda: matrix_to_tt(torch.ones(3, 4, 5), (4, 8), (3, 4)), "weight"),
        (lambda: embedding_to_ttm(torch.ones(25, 8), (4, 6), (2, 4)), "row_modes"),
        (lambda: embedding_to_ttm(torch.ones(24, 8), (4, 6), (8,)), "row_modes and col_modes"),
        (lambda: embedding_to_ttm(torch.ones(24, 8), (4, 6), (2, 4), tol=-1), "tol"),
        (lambda: embedding_to_ttm(torch.ones(24), (4, 6), (2, 4)), "table"),
    ],
)
def test_bad_inputs_raise_value_error(call, name):
    with pytest.raises(ValueError, match=name):
        call()
