"""Batched merges and the group merge against the per-chain merge and the dense oracle."""

from __future__ import annotations

import pytest
import torch

from engine.contract.batched import (
    GroupMergeFunction,
    GroupSpec,
    merge_batched,
    merge_batched_backward,
    padded_rank,
)
from engine.contract.reference import tt_linear_weight
from engine.nn.tt_linear import TTLinear
from engine.tt.chain import merge, merge_backward
from tests.helpers.assertions import assert_close_rel

# (a, s, b) chains: 2-4 cores, odd sizes, boundary ranks 1 and not 1
CHAINS = [
    [(1, 3, 4), (4, 5, 2)],
    [(1, 5, 3), (3, 2, 4), (4, 3, 1)],
    [(2, 3, 4), (4, 2, 5), (5, 3, 3), (3, 2, 1)],
]


@pytest.mark.parametrize("shapes", CHAINS, ids=lambda s: f"k{len(s)}")
@pytest.mark.parametrize("direction", ["ltr", "rtl"])
def test_batched_merge_and_backward_equal_the_chain_merge_per_member(shapes, direction):
    G = 3
    cores = [torch.randn(G, *s, dtype=torch.float64) for s in shapes]
    got, saved = merge_batched(cores, direction)
    grad = torch.randn_like(got)
    d_got = merge_batched_backward(cores, saved, grad, direction)
    for g in range(G):
        member = [c[g] for c in cores]
        want, want_saved = merge(member, direction)
        assert torch.allclose(got[g], want, rtol=1e-13, atol=0)
        for a, b in zip(d_got, merge_backward(member, want_saved, grad[g], direction), strict=True):
            assert torch.allclose(a[g], b, rtol=1e-13, atol=1e-15)


# (in, out, in_modes, out_modes, ranks): padding on either side, d = 2 and 3
LAYERS = [
    (35, 22, (5, 7), (2, 11), (3, 4, 2)),
    (57, 40, (5, 3, 4), (2, 7, 3), (3, 4, 5, 4, 3)),
]


def _members(case, G: int) -> list[TTLinear]:
    n, m, in_modes, out_modes, ranks = case
    layers = [
        TTLinear(n, m, in_modes=in_modes, out_modes=out_modes, ranks=ranks, dtype=torch.float64)
        for _ in range(G)
    ]
    with torch.no_grad():
        for layer in layers:
            for g in layer.gates:
                g.uniform_(0.2, 1.5)
                g[0] = 0.004  # below tau: masked
                g[-1] = -0.5  # negative: masked
    return layers


@pytest.mark.parametrize("case", LAYERS, ids=lambda c: f"{c[0]}x{c[1]}")
@pytest.mark.parametrize("dirs", [("ltr", "rtl"), ("rtl", "ltr"), ("ltr", "ltr")])
def test_group_merge_matches_the_dense_weight_and_its_gradients(case, dirs):
    G = 3
    layers = _members(case, G)
    d = len(case[2])
    spec = GroupSpec(d, case[0], case[1], layers[0].gate_threshold, dirs, G)
    params = [p for layer in layers for p in (*layer.cores, *layer.gates)]
    left, right = GroupMergeFunction.apply(spec, *params)  # (G, N, r), (G, r, M)
    upstream = torch.randn(G, case[0], case[1], dtype=torch.float64)
    got = torch.autograd.grad((left @ right * upstream).sum(), params)
    want_w, want = [], []
    for g, layer in enumerate(layers):
        w_t = layer.to_dense().T  # (N, M) gated dense oracle
        want_w.append(w_t)
        own = [*layer.cores, *layer.gates]
        want += torch.autograd.grad((w_t * upstream[g]).sum(), own)
    for g in range(G):
        assert_close_rel(left[g] @ right[g], want_w[g], 1e-12, f"W member {g}")
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_close_rel(a, b, 1e-11, f"grad {i}")


def test_group_merge_of_a_reference_member_equals_tt_linear_weight():
    layers = _members(LAYERS[1], 2)
    spec = GroupSpec(3, 57, 40, 1e-2, ("ltr", "rtl"), 2)
    left, right = GroupMergeFunction.apply(spec, *[p for m in layers for p in (*m.cores, *m.gates)])
    for g, m in enumerate(layers):
        w = tt_linear_weight(list(m.cores), list(m.gates), 1e-2, 57, 40, 3)  # (out, in)
        assert_close_rel((left[g] @ right[g]).T, w, 1e-12, "weight")


@pytest.mark.parametrize("dirs", [("ltr", "rtl"), ("rtl", "ltr")])
def test_rank_padding_keeps_the_weight_and_every_gradient(dirs):
    case = LAYERS[1]  # middle bond 5
    layers = _members(case, 2)
    params = [p for m in layers for p in (*m.cores, *m.gates)]
    plain = GroupSpec(3, case[0], case[1], layers[0].gate_threshold, dirs, 2)
    padded = plain._replace(rank_to=8)
    upstream = torch.randn(2, case[0], case[1], dtype=torch.float64)
    outs = {}
    for name, spec in (("plain", plain), ("padded", padded)):
        left, right = GroupMergeFunction.apply(spec, *params)
        grads = torch.autograd.grad((left @ right * upstream).sum(), params)
        outs[name] = (left, right, grads)
    left, right, grads = outs["padded"]
    assert left.shape == (2, case[0], 8) and right.shape == (2, 8, case[1])
    assert torch.count_nonzero(left[..., 5:]) == 0 and torch.count_nonzero(right[:, 5:]) == 0
    assert_close_rel(left[..., :5], outs["plain"][0], 1e-13, "left")
    assert_close_rel(left @ right, outs["plain"][0] @ outs["plain"][1], 1e-13, "weight")
    for i, (a, b) in enumerate(zip(grads, outs["plain"][2], strict=True)):
        assert a.shape == b.shape
        assert_close_rel(a, b, 1e-12, f"grad {i}")


@pytest.mark.parametrize(
    ("r", "rows", "want"),
    [
        (30, 4096, 32),
        (31, 256, 32),
        (26, 1024, 32),
        (25, 1024, 25),
        (32, 4096, 32),
        (12, 4096, 12),
        (13, 4096, 16),
        (4, 4096, 4),
        (30, 255, 30),
        (48, 512, 48),
        (60, 512, 64),
    ],
)
def test_padded_rank_rounds_up_to_16_within_a_quarter_from_256_rows(r, rows, want):
    assert padded_rank(r, rows) == want
