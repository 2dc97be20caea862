"""Tests for engine.nn.ttm_embedding, ttm_functional and ttm_naive against the dense oracle."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from engine.contract.reference import ttm_table
from engine.nn.ttm_embedding import TTMEmbedding
from engine.nn.ttm_functional import choose_split, make_plan, ttm_lookup
from engine.nn.ttm_naive import ttm_lookup_naive

DT = torch.float64
TOL = 1e-10

# (num_embeddings, row_modes, col_modes, internal ranks): K = 2, 3, 4, odd and
# non-power-of-two modes, padded rows (V < prod rows) and one unpadded case.
CASES = [
    (33, (5, 7), (3, 4), (3,)),
    (57, (3, 5, 4), (2, 3, 5), (4, 3)),
    (111, (4, 3, 5, 2), (2, 3, 1, 5), (3, 5, 2)),
    (120, (2, 5, 3, 4), (3, 1, 2, 2), (2, 7, 3)),
]
IDS = [pytest.param(c, id=f"K{len(c[1])}-V{c[0]}") for c in CASES]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))


def _module(case, *, dedup=True, seed=0) -> TTMEmbedding:
    v, rows, cols, ranks = case
    torch.manual_seed(seed)
    mod = TTMEmbedding(
        v, math.prod(cols), row_modes=rows, col_modes=cols, ranks=ranks, dedup=dedup, dtype=DT
    )
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for gate in mod.gates:  # mix of live, just-dead (<= tau) and negative entries
            gate.copy_(torch.empty(gate.shape, dtype=DT).uniform_(0.2, 2.0, generator=g))
        mod.gates[0][0] = -0.7
        mod.gates[-1][-1] = 0.01  # exactly tau: dead
        if mod.gates[0].numel() > 2:
            mod.gates[0][1] = 0.005
    return mod


def _ids(v: int, seed=2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (3, 19), generator=g)  # (3, 19)
    ids[0, :4] = torch.tensor([0, v - 1, v - 1, 0])  # both ends, repeated
    ids[2, 5:9] = ids[1, 5:9]  # more repeats
    return ids


def _reference(mod: TTMEmbedding, ids: torch.Tensor) -> torch.Tensor:
    cores, gates, tau = list(mod.cores), list(mod.gates), mod.gate_threshold
    table = ttm_table(cores, gates, tau, mod.num_embeddings, mod.embedding_dim)  # (V, D)
    return table[ids]  # (..., D)


def _grads(mod: TTMEmbedding, out: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad((out * weight).sum(), list(mod.parameters())))


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("case", IDS)
def test_forward_and_gradients_match_dense_gather(case, dedup):
    mod = _module(case, dedup=dedup)
    ids = _ids(mod.num_embeddings)
    ref = _reference(mod, ids)  # (3, 19, D)
    out = mod(ids)
    assert out.shape == (*ids.shape, mod.embedding_dim)
    assert _rel(out, ref) < TOL
    w = torch.randn(out.shape, dtype=DT, generator=torch.Generator().manual_seed(3))
    names = [n for n, _ in mod.named_parameters()]
    for name, got, want in zip(names, _grads(mod, out, w), _grads(mod, ref, w), strict=True):
        assert got.shape == want.shape, name
        assert _rel(got, want) < TOL or float(want.abs().max()) == 0.0, name
        assert torch.allclose(got, want, rtol=TOL, atol=TOL * float(want.abs().max())), name


@pytest.mark.parametrize("dedup", [True, False])
def test_broadcast_upstream_gradient(dedup):
    """``out.sum()`` hands the backward an expanded (stride-0) gradient."""
    mod = _module(CASES[1], dedup=dedup)
    ids = _ids(mod.num_embeddings)
    got = torch.autograd.grad(mod(ids).sum(), list(mod.parameters()))
    want = torch.autograd.grad(_reference(mod, ids).sum(), list(mod.parameters()))
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=TOL, atol=TOL * float(w.abs().max()))


@pytest.mark.parametrize("case", IDS)
def test_every_split_matches(case):
    mod = _module(case)
    ids = _ids(mod.num_embeddings)
    cores, gates = list(mod.cores), list(mod.gates)
    ref = _reference(mod, ids)
    w = torch.randn(ref.shape, dtype=DT, generator=torch.Generator().manual_seed(4))
    want = _grads(mod, ref, w)
    for h in range(1, len(cores)):
        plan = make_plan([tuple(c.shape) for c in cores], h)
        out = ttm_lookup(ids, cores, gates, mod.gate_threshold, plan=plan)
        assert _rel(out, ref) < TOL, h
        for got, exp in zip(_grads(mod, out, w), want, strict=True):
            assert torch.allclose(got, exp, rtol=TOL, atol=TOL * float(exp.abs().max())), h


@pytest.mark.parametrize("case", IDS)
def test_naive_lookup_matches(case):
    mod = _module(case)
    ids = _ids(mod.num_embeddings)
    ref = _reference(mod, ids)
    out = ttm_lookup_naive(ids, list(mod.cores), list(mod.gates), mod.gate_threshold)
    assert _rel(out, ref) < TOL
    w = torch.randn(ref.shape, dtype=DT, generator=torch.Generator().manual_seed(5))
    for got, exp in zip(_grads(mod, out, w), _grads(mod, ref, w), strict=True):
        assert torch.allclose(got, exp, rtol=TOL, atol=TOL * float(exp.abs().max()))


def test_split_choice_mnli():
    shapes = [(1, 16, 4, 32), (32, 20, 4, 32), (32, 10, 8, 32), (32, 10, 6, 1)]
    assert choose_split(shapes) == 2
    plan = make_plan(shapes)
    assert plan.left_shape == (320, 16, 32) and plan.right_shape == (100, 32, 48)


def _expected_numel(mod: TTMEmbedding) -> int:
    """Entries left after a shrink, from the surviving gate counts alone."""
    alive = [int((g > mod.gate_threshold).sum()) for g in mod.gates]
    if 0 in alive:
        return 0
    r = [1, *alive, 1]
    sizes = [n * m for n, m in zip(mod.row_modes, mod.col_modes, strict=True)]
    return sum(r[k] * s * r[k + 1] for k, s in enumerate(sizes)) + sum(alive)


@pytest.mark.parametrize("case", IDS)
def test_shrink_keeps_output_and_reports_slices(case):
    mod = _module(case)
    ids = _ids(mod.num_embeddings)
    before = mod(ids).detach()
    mod(ids).sum().backward()
    params = list(mod.parameters())
    old = {p: p.detach().clone() for p in params}
    old_grad = {p: p.grad.clone() for p in params}
    expected = _expected_numel(mod)
    drop = mod.num_parameters() - expected
    slices = mod.shrink_()
    assert drop > 0 and mod.num_parameters() == expected
    assert list(mod.parameters()) == params  # same Parameter objects
    assert mod.active_ranks() == mod.ranks
    assert _rel(mod(ids), before) < TOL
    for p in params:  # the reported slices, replayed on the old tensors, give the new ones
        data, grad = old[p], old_grad[p]
        for dim, idx in slices.get(p, []):
            data, grad = data.index_select(dim, idx), grad.index_select(dim, idx)
        assert torch.equal(data, p.data) and torch.equal(grad, p.grad)
    for g in mod.gates:
        assert bool((g > mod.gate_threshold).all())
    assert mod.shrink_() == {}  # nothing left to cut


def test_shrink_then_optimizer_state_follows():
    mod = _module(CASES[2])
    ids = _ids(mod.num_embeddings)
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-3)
    mod(ids).square().sum().backward()
    opt.step()
    slices = mod.shrink_()
    for p, cuts in slices.items():
        for key in ("exp_avg", "exp_avg_sq"):
            for dim, idx in cuts:
                opt.state[p][key] = opt.state[p][key].index_select(dim, idx)
    opt.zero_grad()
    mod(ids).square().sum().backward()
    opt.step()  # shapes line up


def test_all_dead_bond():
    mod = _module(CASES[2])
    ids = _ids(mod.num_embeddings)
    with torch.no_grad():
        mod.gates[1].fill_(-1.0)
    assert float(mod(ids).detach().abs().max()) == 0.0
    mod.shrink_()
    assert mod.ranks == (1, 0, 0, 0, 1)
    assert mod.num_parameters() == 0 and mod.tt_parameters() == 0
    assert mod.compression_ratio() == math.inf
    out = mod(ids)
    assert out.shape == (*ids.shape, mod.embedding_dim) and float(out.detach().abs().max()) == 0.0
    out.sum().backward()
    assert all(p.grad is None or p.grad.numel() == 0 for p in mod.parameters())
    assert torch.equal(mod.to_dense(), torch.zeros(mod.num_embeddings, mod.embedding_dim, dtype=DT))


@pytest.mark.parametrize("case", IDS)
def test_fold_gates_keeps_output(case):
    mod = _module(case)
    ids = _ids(mod.num_embeddings)
    before = mod(ids).detach()
    mod.fold_gates_()
    assert all(bool((g == 1).all()) for g in mod.gates)
    assert _rel(mod(ids), before) < TOL


def test_from_embedding_recovers_known_ttm_rank():
    src = _module((120, (2, 5, 3, 4), (3, 1, 2, 2), (2, 3, 2)))
    with torch.no_grad():
        for g in src.gates:
            g.fill_(1.0)
    table = src.to_dense()  # (120, 12), TTM ranks (1, 2, 3, 2, 1)
    emb = nn.Embedding(120, 12, dtype=DT)
    with torch.no_grad():
        emb.weight.copy_(table)
    mod = TTMEmbedding.from_embedding(
        emb, tol=1e-10, row_modes=(2, 5, 3, 4), col_modes=(3, 1, 2, 2)
    )
    assert mod.ranks == (1, 2, 3, 2, 1)
    assert _rel(mod.to_dense(), table) < 1e-8
    ids = _ids(120)
    assert _rel(mod(ids), table[ids]) < 1e-8
    assert all(not c.is_meta for c in mod.parameters())


def test_mnli_shapes():
    mod = TTMEmbedding(
        30522,
        768,
        row_modes=[16, 20, 10, 10],
        col_modes=[4, 4, 8, 6],
        ranks=[1, 32, 32, 32, 1],
        device="meta",
    )
    assert mod.tt_parameters() == 167808
    assert mod.num_parameters() == 167808 + 96
    assert mod.dense_parameters() == 30522 * 768
    assert mod.compression_ratio() == pytest.approx(139.69, abs=0.01)
    assert "ranks=[1, 32, 32, 32, 1]" in repr(mod)


def test_automatic_modes():
    mod = TTMEmbedding(30522, 768, max_rank=8, device="meta")
    assert len(mod.row_modes) == 4 and math.prod(mod.row_modes) >= 30522
    assert list(mod.row_modes) == sorted(mod.row_modes, reverse=True)
    assert list(mod.col_modes) == sorted(mod.col_modes) and math.prod(mod.col_modes) == 768
    small = TTMEmbedding(1000, 7, max_rank=4, device="meta")
    assert len(small.row_modes) == 3 and math.prod(small.col_modes) == 7


def test_init_variance_like_nn_embedding():
    torch.manual_seed(0)
    mod = TTMEmbedding(4000, 64, max_rank=16, dtype=DT)
    assert float(mod.to_dense().detach().square().mean()) == pytest.approx(1.0, rel=0.3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_embeddings": 0}, "num_embeddings"),
        ({"embedding_dim": -1}, "embedding_dim"),
        ({"ranks": (3, 0, 2)}, "ranks"),
        ({"ranks": (3, 2)}, "ranks"),
        ({"gate_threshold": -0.1}, "gate_threshold"),
        ({"max_rank": 0, "ranks": None}, "max_rank"),
        ({"row_modes": (4, 3, 5, 1)}, "row_modes"),
        ({"col_modes": (2, 3, 1, 4)}, "col_modes"),
        ({"col_modes": (2, 3, 5)}, "col_modes"),
        ({"d": 1, "row_modes": None, "col_modes": None}, "d"),
    ],
)
def test_invalid_arguments(kwargs, name):
    args = {
        "num_embeddings": 111,
        "embedding_dim": 30,
        "row_modes": (4, 3, 5, 2),
        "col_modes": (2, 3, 1, 5),
        "ranks": (3, 5, 2),
    } | kwargs
    with pytest.raises(ValueError, match=name):
        TTMEmbedding(**args)


def test_ids_out_of_range():
    mod = _module(CASES[0])
    with pytest.raises(IndexError, match="ids must be in"):
        mod(torch.tensor([0, mod.num_embeddings]))
    with pytest.raises(IndexError, match="ids must be in"):
        mod(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError):
        mod(torch.tensor([0.0]))
    assert mod(torch.empty(0, 5, dtype=torch.long)).shape == (0, 5, mod.embedding_dim)


def test_padding_idx_reads_zero_and_sends_no_gradient_like_nn_embedding():
    emb = TTMEmbedding(
        30, 12, max_rank=3, row_modes=(5, 6), col_modes=(3, 4), padding_idx=-2, dtype=torch.float64
    )
    assert emb.padding_idx == 28
    ids = torch.tensor([[28, 3, 28], [7, 3, 0]])
    out = emb(ids)
    assert torch.all(out[0, 0] == 0) and torch.all(out[0, 2] == 0)
    table = emb.to_dense()
    assert torch.all(table[28] == 0)
    torch.testing.assert_close(out[1], table[[7, 3, 0]], rtol=1e-12, atol=1e-14)
    # gradients equal those of the lookup with the padded positions removed
    params = list(emb.parameters())
    g_pad = torch.autograd.grad(out.pow(2).sum(), params)
    keep = emb(torch.tensor([3, 7, 3, 0]))
    g_ref = torch.autograd.grad(keep.pow(2).sum(), params)
    for a, b in zip(g_pad, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="padding_idx"):
        TTMEmbedding(30, 12, max_rank=3, padding_idx=30)


def test_from_embedding_keeps_padding_idx():
    src = nn.Embedding(20, 8, padding_idx=0, dtype=torch.float64)
    emb = TTMEmbedding.from_embedding(src, row_modes=(4, 5), col_modes=(2, 4))
    assert emb.padding_idx == 0
    ids = torch.tensor([0, 5, 19])
    torch.testing.assert_close(emb(ids), src(ids), rtol=1e-8, atol=1e-10)
