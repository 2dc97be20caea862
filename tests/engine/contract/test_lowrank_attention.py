"""Rank-space self-attention against plain torch attention on the dense projections (float64,
autograd): output and every gradient, with biases or not, padding and causal masks, dropout
(the same masks), probabilities kept or rebuilt, ranks that differ per projection; and the
cost model against counted multiply-adds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from engine.contract.lowrank_attention import (
    AttentionGeometry,
    LowRankAttentionFunction,
    attention_factors,
    lowrank_macs,
    lowrank_pays,
    standard_macs,
)
from engine.contract.premerged import PremergedLinearFunction
from engine.nn.attention import AttentionFunction
from engine.nn.dropout import dropout_mask
from tests.helpers.assertions import assert_close_rel

f64 = {"dtype": torch.float64}
SEED = 11


def _leaf(*shape: int) -> torch.Tensor:
    return (torch.randn(*shape, **f64) * 0.5).requires_grad_()


def _params(d: int, ranks: tuple[int, int, int, int], biases: tuple[bool, bool, bool, bool]):
    """Halves and biases of q, k, v, out: ``[(L, R, b), ...]``."""
    return [
        (_leaf(d, r), _leaf(r, d), _leaf(d) if has else None)
        for r, has in zip(ranks, biases, strict=True)
    ]


def _reference(x, params, heads, keep, p):
    """Dense projections, (B, H, S, E) heads, masked softmax, dropout, output projection."""
    b, s, d = x.shape
    e = d // heads

    def proj(t, lrb):
        left, right, bias = lrb
        y = t.reshape(-1, d) @ left @ right  # (n, D)
        return y if bias is None else y + bias

    q, k, v = (proj(x, lrb).view(b, s, heads, e).transpose(1, 2) for lrb in params[:3])
    scores = q @ k.transpose(-1, -2) / math.sqrt(e)  # (B, H, S, T)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    prob = torch.softmax(scores, dim=-1)
    if keep is not None:
        prob = prob.masked_fill((~keep).all(-1, keepdim=True), 0.0)  # rows with no key
    if p > 0:
        torch.manual_seed(SEED)
        mask = dropout_mask((b * heads, s, s), 1.0 - p).view(b, heads, s, s)
        prob = prob * mask / (1.0 - p)
    y = (prob @ v).transpose(1, 2).reshape(b * s, d)  # (n, D)
    return proj(y, params[3]).view(b, s, d)


def _lowrank(x, params, heads, keep, p, save_probs):
    b, s, d = x.shape
    (lq, rq, bq), (lk, rk, bk), (lv, rv, bv), (lo, ro, bo) = params
    c, w = attention_factors(rq, rk, rv, bq, bv, lo, heads)
    geo = AttentionGeometry(b, s, heads, p, save_probs, out_ones=bo is not None)
    torch.manual_seed(SEED)
    u = LowRankAttentionFunction.apply(x.reshape(-1, d), lq, lk, lv, c, w, bk, keep, geo)
    y = u @ ro if bo is None else u @ torch.cat([ro, bo.unsqueeze(0)])  # (n, D)
    return y.view(b, s, d)


def _keep(kind: str, b: int, s: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "causal":
        return torch.ones(s, s, dtype=torch.bool).tril()  # (S, T)
    keep = torch.ones(b, 1, 1, s, dtype=torch.bool)  # (B, 1, 1, T) padding
    keep[0, ..., s // 2 :] = False
    keep[-1] = False  # a sequence that is all padding: no query has a key
    return keep


@pytest.mark.parametrize("rows", [(2, 7), (3, 90)])  # both orientations of x L (< / >= 256)
@pytest.mark.parametrize("biases", [(True,) * 4, (False,) * 4, (True, False, False, True)])
@pytest.mark.parametrize("keep_kind", ["none", "padding", "causal"])
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("save_probs", [True, False])
def test_matches_dense_attention_in_float64(rows, biases, keep_kind, p, save_probs):
    b, s = rows
    heads, d, ranks = 2, 12, (3, 4, 5, 2)  # every projection at its own rank
    x = _leaf(b, s, d)
    params = _params(d, ranks, biases)
    keep = _keep(keep_kind, b, s)
    got = _lowrank(x, params, heads, keep, p, save_probs)
    want = _reference(x, params, heads, keep, p)
    assert_close_rel(got, want, 1e-12, "output")
    names = ["x"] + [
        f"{layer}.{part}"
        for layer, lrb in zip("qkvo", params, strict=True)
        for part, t in zip(("L", "R", "b"), lrb, strict=True)
        if t is not None
    ]
    leaves = [x] + [t for lrb in params for t in lrb if t is not None]
    up = torch.randn_like(want)
    g_got = torch.autograd.grad(got, leaves, up, allow_unused=True)
    g_want = torch.autograd.grad(want, leaves, up, allow_unused=True)
    scale = max(float(g.abs().max()) for g in g_want)
    for name, a, e in zip(names, g_got, g_want, strict=True):
        assert a is not None and e is not None, f"{name}: gradient missing"
        if name == "k.b":  # shifts all of a query's scores alike: exactly zero
            assert float(a.abs().max()) == 0.0 and float(e.abs().max()) < 1e-12 * scale
        else:
            assert_close_rel(a, e, 1e-10, f"gradient of {name}")


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("heads, d, rank", [(2, 16, 3), (4, 16, 8), (2, 8, 6)])
def test_cost_model_counts_the_multiply_adds_that_differ(heads, d, rank):
    """Forward FLOPs counted by torch, minus what both paths share, are the cost model's
    (standard: per-layer premerged products and the unfused attention; out without bias)."""
    b, s = 3, 10
    ranks, biases = (rank,) * 4, (True, True, True)
    x = torch.randn(b, s, d, **f64)
    params = _params(d, ranks, (*biases, False))
    (lq, rq, bq), (lk, rk, bk), (lv, rv, bv), (lo, ro, _) = params
    c, w = attention_factors(rq, rk, rv, bq, bv, lo, heads)
    geo = AttentionGeometry(b, s, heads, 0.1, True)
    x2 = x.reshape(-1, d)

    def lowrank():
        LowRankAttentionFunction.apply(x2, lq, lk, lv, c, w, bk, None, geo) @ ro

    def standard():
        e = d // heads
        q, k, v = (
            PremergedLinearFunction.apply(x2, left, right, bias, None)
            .view(b, s, heads, e)
            .transpose(1, 2)
            for left, right, bias in params[:3]
        )
        y = AttentionFunction.apply(q, k, v, None, 0.1).transpose(1, 2).reshape(-1, d)
        PremergedLinearFunction.apply(y, lo, ro, None, None)

    shared_first = 2 * b * s * d * 3 * rank  # x L of q, k, v
    shared_out = 2 * b * s * rank * d  # u R_o
    measured_std = _counted(standard) - shared_first - shared_out
    measured_lr = _counted(lowrank) - shared_first - shared_out
    assert measured_std == 2 * standard_macs(b * s, geo, d, ranks, biases)
    assert measured_lr == 2 * lowrank_macs(b * s, geo, d, ranks, biases)
    assert lowrank_pays(b * s, geo, d, ranks, biases) == (measured_lr < measured_std)


def test_the_mnli_attention_pays_and_a_wide_rank_does_not():
    geo = AttentionGeometry(8, 128, 12, 0.1, True)
    mnli = (32, 32, 32, 32)
    assert lowrank_pays(1024, geo, 768, mnli, (True,) * 3)
    n_std = standard_macs(1024, geo, 768, mnli, (True,) * 3)
    assert n_std / lowrank_macs(1024, geo, 768, mnli, (True,) * 3) > 2.3
    assert not lowrank_pays(1024, geo, 768, (128,) * 4, (True,) * 3)  # r = 2 E


def test_float32_matches_float64():
    torch.manual_seed(0)
    b, s, heads, d = 2, 16, 4, 32
    params64 = _params(d, (4, 4, 4, 4), (True,) * 4)
    x64 = _leaf(b, s, d)
    params32 = [
        tuple(None if t is None else t.detach().float().requires_grad_() for t in lrb)
        for lrb in params64
    ]
    x32 = x64.detach().float().requires_grad_()
    got = _lowrank(x32, params32, heads, None, 0.1, True)
    want = _lowrank(x64, params64, heads, None, 0.1, True)
    assert_close_rel(got.double(), want, 1e-5, "float32 output")
    F.mse_loss(got, torch.zeros_like(got)).backward()
    F.mse_loss(want, torch.zeros_like(want)).backward()
    assert_close_rel(x32.grad.double(), x64.grad, 1e-4, "float32 dx")
