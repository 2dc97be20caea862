"""comera::merge_pair over a batch of chains, and the chain merges built on it, against
autograd of the float64 reference and :mod:`engine.tt.chain`."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.merge import (
    merge_chain,
    merge_chain_backward,
    merge_pair,
    merge_pair_backward,
    merge_pair_reference,
)
from engine.tt.chain import merge, merge_backward
from tests.engine.kernels.conftest import DTYPES, opcheck_utils
from tests.helpers.assertions import assert_close_rel, grads

# (G, a, n, r, m, b): odd sizes, rank 1, a batch of one, a long a * n reduction for dY
PAIRS = [
    pytest.param(3, 2, 3, 5, 4, 3, id="odd"),
    pytest.param(2, 1, 5, 1, 3, 1, id="rank1"),
    pytest.param(1, 1, 70, 3, 2, 2, id="long-rows"),
]


def _rand(shape, dtype, device, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("dtype, tol", DTYPES)
@pytest.mark.parametrize("g, a, n, r, m, b", PAIRS)
def test_merge_pair_and_gradients_match_float64_reference(g, a, n, r, m, b, dtype, tol, device):
    x = _rand((g, a, n, r), dtype, device, 0).requires_grad_(True)
    y = _rand((g, r, m, b), dtype, device, 1).requires_grad_(True)
    z = merge_pair(x, y, True)  # (G, a, n m, b)
    x64, y64 = (t.detach().double().requires_grad_(True) for t in (x, y))
    ref = merge_pair_reference(x64, y64)
    assert z.shape == (g, a, n * m, b) and z.dtype == dtype
    assert_close_rel(z.double(), ref, tol, "Z")
    up = _rand(z.shape, dtype, device, 2)
    for name, got, want in zip(
        ("dX", "dY"), grads(z, [x, y], up), grads(ref, [x64, y64], up.double()), strict=True
    ):
        assert_close_rel(got.double(), want, tol, name)


def test_merge_pair_gradcheck_in_float64():
    x = torch.randn(2, 1, 3, 2, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda u, v: merge_pair(u, v, False), (x, y))


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_opcheck(use_triton, device):
    x = _rand((2, 1, 3, 2), torch.float32, device, 0).requires_grad_(True)
    y = _rand((2, 2, 2, 3), torch.float32, device, 1)
    torch.library.opcheck(merge_pair, (x, y, use_triton), test_utils=opcheck_utils(use_triton))
    dz = _rand((2, 1, 6, 3), torch.float32, device, 2)
    torch.library.opcheck(
        merge_pair_backward,
        (dz, x.detach(), y, use_triton),
        test_utils=opcheck_utils(use_triton, backward_op=True),
    )


@pytest.mark.parametrize("direction", ["ltr", "rtl"])
def test_chain_merge_and_backward_match_torch_chain(direction, device):
    """Three cores, ranks (1, 3, 2, 1) or (2, 1, 3, 1): merged matrix, saved intermediates
    and every core gradient equal :mod:`engine.tt.chain`'s (float64 there)."""
    ranks = (1, 3, 2, 1) if direction == "ltr" else (2, 1, 3, 1)
    sizes = (3, 5, 2)
    cores = [
        _rand((ranks[k], s, ranks[k + 1]), torch.float32, device, k) for k, s in enumerate(sizes)
    ]
    cores64 = [c.double() for c in cores]
    p, saved = merge_chain(cores, direction, "triton")
    p_ref, saved_ref = merge(cores64, direction)
    assert_close_rel(p.double(), p_ref, 1e-5, "P")
    assert len(saved) == len(saved_ref)
    for s, s_ref in zip(saved, saved_ref, strict=True):
        assert_close_rel(s.double(), s_ref, 1e-5, "saved")
    grad = _rand(p.shape, torch.float32, device, 9)
    got = merge_chain_backward(cores, saved, grad, direction, "triton")
    want = merge_backward(cores64, saved_ref, grad.double(), direction)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == cores[k].shape
        assert_close_rel(g.double(), w, 1e-5, f"core {k}")


def test_torch_backend_is_the_chain_module():
    cores = [torch.randn(1, 3, 2), torch.randn(2, 4, 1)]
    p, saved = merge_chain(cores, "ltr", "torch")
    p_ref, saved_ref = merge(cores, "ltr")
    assert torch.equal(p, p_ref) and all(map(torch.equal, saved, saved_ref))
