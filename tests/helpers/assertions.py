"""Verbose comparisons shared by the tests (pytest-free)."""

from __future__ import annotations

import torch
from torch import Tensor


def rel_err(actual: Tensor, expected: Tensor) -> float:
    """max |a - e| / max(max |e|, tiny): a scale-aware max-norm relative error."""
    scale = expected.detach().abs().max().clamp_min(1e-300)
    return float((actual.detach() - expected.detach()).abs().max() / scale)


def assert_close_rel(actual: Tensor, expected: Tensor, tol: float, what: str = "") -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = rel_err(actual, expected)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


def grads(out: Tensor, inputs: list[Tensor], upstream: Tensor) -> list[Tensor]:
    """Gradients of <out, upstream> w.r.t. ``inputs`` (zeros where unused)."""
    gs = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs, strict=True)]
