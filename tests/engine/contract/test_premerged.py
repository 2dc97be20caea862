"""Products from given halves: single layer, siblings on one input, and the FFN block,
against autograd through plain torch ops (float64), and under bfloat16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.contract.premerged import (
    PremergedFFNFunction,
    PremergedLinearFunction,
    SiblingLinearFunction,
)
from tests.helpers.assertions import assert_close_rel

f64 = {"dtype": torch.float64}


def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, **f64).requires_grad_()


def _check(out, ref, inputs) -> None:
    up = torch.randn_like(ref)
    got = torch.autograd.grad(out, inputs, up, allow_unused=True)
    want = torch.autograd.grad(ref, inputs, up, allow_unused=True)
    assert_close_rel(out, ref, 1e-12, "output")
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), f"input {i}"
        if a is not None:
            assert_close_rel(a, b, 1e-12, f"grad {i}")


@pytest.mark.parametrize("rows", [5, 300])  # both orientations of the first product
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", [None, "gelu"])
def test_premerged_linear_matches_autograd(rows, bias, act):
    x, left, right = _leaf(rows, 13), _leaf(13, 4), _leaf(4, 7)
    b = _leaf(7) if bias else None
    y = PremergedLinearFunction.apply(x, left, right, b, act)
    a = F.gelu(x) if act else x
    ref = a @ left @ right + (b if bias else 0.0)
    _check(y, ref, [t for t in (x, left, right, b) if t is not None])


@pytest.mark.parametrize("bias", [True, False])
def test_siblings_match_separate_layers(bias):
    S, B, N, r, M = 3, 6, 11, 4, 9
    x, lefts, rights = _leaf(B, N), _leaf(S, N, r), _leaf(S, r, M)
    biases = _leaf(S, M) if bias else None
    y = SiblingLinearFunction.apply(x, lefts, rights, biases)  # (S, B, M)
    ref = torch.stack([x @ lefts[s] @ rights[s] + (biases[s] if bias else 0.0) for s in range(S)])
    _check(y, ref, [t for t in (x, lefts, rights, biases) if t is not None])


@pytest.mark.parametrize("block", [4, 64])  # several row blocks, one
@pytest.mark.parametrize("bias", [True, False])
def test_premerged_ffn_matches_autograd(block, bias):
    B, D, Fh, r1, r2 = 10, 12, 17, 3, 5
    x, l1, r1_, l2, r2_ = _leaf(B, D), _leaf(D, r1), _leaf(r1, Fh), _leaf(Fh, r2), _leaf(r2, D)
    b1, b2 = (_leaf(Fh), _leaf(D)) if bias else (None, None)
    y = PremergedFFNFunction.apply(x, l1, r1_, b1, l2, r2_, b2, block)
    h = x @ l1 @ r1_ + (b1 if bias else 0.0)
    ref = F.gelu(h) @ l2 @ r2_ + (b2 if bias else 0.0)
    _check(y, ref, [t for t in (x, l1, r1_, b1, l2, r2_, b2) if t is not None])


def test_autocast_bf16_runs_products_in_bf16_and_returns_float32_gradients():
    x = torch.randn(8, 16, requires_grad=True)
    left = torch.randn(16, 4, requires_grad=True)
    right = torch.randn(4, 6, requires_grad=True)
    b = torch.randn(6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = PremergedLinearFunction.apply(x, left, right, b, None)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert {t.grad.dtype for t in (x, left, right, b)} == {torch.float32}
    ref = x.detach() @ left.detach() @ right.detach() + b.detach()
    assert_close_rel(y.float(), ref, 3e-2, "bf16 output")
