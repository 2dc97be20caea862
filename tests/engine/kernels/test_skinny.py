"""comera::skinny_mm / wide_mm / skinny_tmm (gelu, gelu' and the bias column fused) and the
Triton TT-linear end to end, against autograd of the float64 references."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.config import ENV_PIN
from engine.kernels.skinny import (
    skinny_mm,
    skinny_mm_reference,
    skinny_tmm,
    skinny_tmm_reference,
    wide_mm,
    wide_mm_reference,
)
from engine.nn.tt_linear import TTLinear
from tests.engine.kernels.conftest import DTYPES, opcheck_utils
from tests.helpers.assertions import assert_close_rel, grads

ACTS = ["none", "gelu"]


def _rand(shape, dtype, device, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


def _check(op, ref, inputs, dtype, tol, device, what):
    """``op(*inputs)`` and the gradients of every floating input against ``ref`` in float64."""
    leaves = [t.requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    out = op(*leaves)
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    want_out = ref(*leaves64)
    assert out.dtype == dtype and out.shape == want_out.shape, what
    assert_close_rel(out.double(), want_out, tol, f"{what} out")
    up = _rand(out.shape, dtype, device, 7)
    for i, (g, w) in enumerate(
        zip(grads(out, leaves, up), grads(want_out, leaves64, up.double()), strict=True)
    ):
        assert_close_rel(g.double(), w, tol, f"{what} d{i}")


@pytest.mark.parametrize("dtype, tol", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("ones", [False, True], ids=["", "ones"])
def test_skinny_mm(act, ones, dtype, tol, device):
    """``[act(x) L, 1]`` for x (37, 21), L (21, 3); its backward runs wide_mm and skinny_tmm."""
    x, left = _rand((37, 21), dtype, device, 0), _rand((21, 3), dtype, device, 1)
    _check(
        lambda a, b: skinny_mm(a, b, act, ones, True),
        lambda a, b: skinny_mm_reference(a, b, act, ones),
        [x, left],
        dtype,
        tol,
        device,
        "skinny_mm",
    )


@pytest.mark.parametrize("act", ACTS)
def test_wide_mm_rank1(act, device):
    """``(u R) * act'(x)`` for u (5, 1), R (1, 19): rank one, the output wider than a tile."""
    t, w = _rand((5, 1), torch.float32, device, 2), _rand((1, 19), torch.float32, device, 3)
    pre = _rand((5, 19), torch.float32, device, 4) if act == "gelu" else None
    _check(
        lambda a, b: wide_mm(a, b, pre, act, True),
        lambda a, b: wide_mm_reference(a, b, None if pre is None else pre.double(), act),
        [t, w],
        torch.float32,
        1e-5,
        device,
        "wide_mm",
    )


def test_wide_mm_is_not_differentiable_in_pre(device):
    t, w = _rand((3, 2), torch.float32, device, 0), _rand((2, 4), torch.float32, device, 1)
    pre = _rand((3, 4), torch.float32, device, 2).requires_grad_(True)
    with pytest.raises(NotImplementedError, match="not differentiable with respect to pre"):
        wide_mm(t, w, pre, "gelu", True).sum().backward()


@pytest.mark.parametrize("split", [1, 3], ids=["one-program", "split-k3"])
def test_skinny_tmm_long_reduction(split, device, monkeypatch):
    """``gelu(x)^T u`` over 100 rows: several K blocks per program, and (pinned) a reduction
    split over three programs accumulating atomically."""
    monkeypatch.setenv(ENV_PIN, f"16,16,16,4,2,{split}")
    x, u = _rand((100, 5), torch.float32, device, 0), _rand((100, 2), torch.float32, device, 1)
    _check(
        lambda a, b: skinny_tmm(a, b, "gelu", True),
        lambda a, b: skinny_tmm_reference(a, b, "gelu"),
        [x, u],
        torch.float32,
        1e-5,
        device,
        "skinny_tmm",
    )


def test_strided_and_broadcast_inputs(device):
    """Transposed views and a stride-0 (expanded) gradient go in without copies."""
    x = _rand((4, 9), torch.float32, device, 0)
    r_t = _rand((3, 9), torch.float32, device, 1).T  # (9, 3) view, strides (1, 9)
    dy = torch.ones(1, 1, device=device).expand(4, 9)  # strides (0, 0)
    assert torch.allclose(skinny_mm(x, r_t, "none", False, True), x @ r_t, atol=1e-5)
    assert torch.allclose(skinny_tmm(x, dy, "none", True), x.T @ dy, atol=1e-5)


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_opcheck(use_triton, device):
    f32 = torch.float32
    x = _rand((6, 5), f32, device, 0).requires_grad_(True)
    left = _rand((5, 2), f32, device, 1).requires_grad_(True)
    torch.library.opcheck(
        skinny_mm, (x, left, "gelu", True, use_triton), test_utils=opcheck_utils(use_triton)
    )
    u, pre = _rand((6, 2), f32, device, 2), _rand((6, 5), f32, device, 3)
    torch.library.opcheck(
        wide_mm, (u, left.detach().T, pre, "gelu", use_triton), test_utils=opcheck_utils(use_triton)
    )
    torch.library.opcheck(
        skinny_tmm, (x, u, "none", use_triton), test_utils=opcheck_utils(use_triton)
    )


def test_gradcheck_in_float64():
    """The three registered backwards (torch path) against finite differences."""
    f64 = {"dtype": torch.float64, "requires_grad": True}
    x, left, u = torch.randn(4, 3, **f64), torch.randn(3, 2, **f64), torch.randn(4, 2, **f64)
    pre = torch.randn(4, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: skinny_mm(a, b, "gelu", True, False), (x, left))
    assert torch.autograd.gradcheck(lambda a, b: wide_mm(a, b, pre, "gelu", False), (u, left.T))
    assert torch.autograd.gradcheck(lambda a, b: skinny_tmm(a, b, "gelu", False), (x, u))


@pytest.mark.parametrize(
    "bias, act", [(True, "gelu"), (False, None)], ids=["bias-gelu", "nobias-linear"]
)
def test_tt_linear_matches_dense_reference(bias, act, device):
    """TTLinear(kernel=TRITON), float32, padded in and out (29 -> 19 on 5x6 -> 4x5 modes),
    dead and negative gates: output and the gradients of x, every core, gate and the bias
    against autograd through the dense float64 weight."""
    torch.manual_seed(0)
    shape = {"in_modes": (5, 6), "out_modes": (4, 5), "ranks": (1, 3, 2, 4, 1)}
    layer = TTLinear(29, 19, bias=bias, **shape, kernel="triton", device=device)
    with torch.no_grad():
        layer.gates[0][0] = -0.3
        layer.gates[2][1] = layer.gate_threshold  # exactly tau: dead
        layer.gates[1].mul_(0.7)
    x = _rand((7, 29), torch.float32, device, 1).requires_grad_(True)
    y = layer(x, act)  # (7, 19)
    ref_layer = TTLinear(
        29, 19, bias=bias, **shape, plan="reference", dtype=torch.float64, device=device
    )
    ref_layer.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    x64 = x.detach().double().requires_grad_(True)
    ref = ref_layer(x64, act)
    assert_close_rel(y.double(), ref, 1e-5, "y")
    up = _rand(y.shape, torch.float32, device, 2)
    names = ["x", *(n for n, _ in layer.named_parameters())]
    got = grads(y, [x, *layer.parameters()], up)
    want = grads(ref, [x64, *ref_layer.parameters()], up.double())
    for name, g, w in zip(names, got, want, strict=True):
        if float(w.abs().max()) == 0.0:
            assert float(g.abs().max()) == 0.0, name
        else:
            assert_close_rel(g.double(), w, 1e-5, name)
