"""The fused skinny products of a merged TT-linear ``y = act(x) L R + b``, as custom ops.

With ``L (N, r)``, ``R (r, M)`` and ``r`` a TT rank (see :mod:`engine.contract.execute`) the
forward and backward of the fused plan are products with one side of width ``r``::

    skinny_mm(a, b, act, ones)  = [act(a) @ b, 1]          (B, K) @ (K, r)   -> (B, r [+ 1])
    wide_mm(t, w, pre, act)     = (t @ w) * act'(pre)       (B, r) @ (r, N)   -> (B, N)
    skinny_tmm(a, g, act)       = act(a)^T @ g              (K, B) @ (B, r)   -> (K, r)

so ``T1 = skinny_mm(x, L, act, bias)``, ``y = wide_mm(T1, [R; b])``, ``u = skinny_mm(dy, R^T)``,
``dx = wide_mm(u, L^T, x, act)``, ``dL = skinny_tmm(x, u, act)``, ``[dR; db] = skinny_tmm(T1,
dy)``. The Triton versions fuse what torch runs as separate passes: ``gelu(x)`` is computed
while ``x`` is loaded (never stored, in forward or backward), ``gelu'(x)`` is applied to the
``dx`` tile before it is stored, the column of ones for the bias is written by the same
kernel, and ``skinny_tmm``'s long reduction over the rows is split over programs. ``act`` is
``"none"`` or ``"gelu"`` (``F.gelu``, erf form). The three ops are each other's gradients, so
each has ``register_autograd`` (the gradient of ``wide_mm`` with respect to ``pre`` is not
implemented: it is the second derivative of the activation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernels.backend import ensure_triton

__all__ = [
    "ACTS",
    "skinny_mm",
    "skinny_tmm",
    "wide_mm",
    "skinny_mm_reference",
    "skinny_tmm_reference",
    "wide_mm_reference",
]

ACTS = ("none", "gelu")


def _check_act(activation: str) -> None:
    torch._check(
        activation in ACTS, lambda: f"activation must be one of {ACTS}, got {activation!r}"
    )


def _check_mm(a: Tensor, b: Tensor, k_dim: int) -> None:
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "operands must be 2-D")
    torch._check(
        a.shape[k_dim] == b.shape[0],
        lambda: f"shapes do not match: {tuple(a.shape)}, {tuple(b.shape)}",
    )
    torch._check(a.dtype == b.dtype, lambda: f"dtypes differ: {a.dtype}, {b.dtype}")


def _act(a: Tensor, activation: str) -> Tensor:
    return F.gelu(a) if activation == "gelu" else a


# ---- references ------------------------------------------------------------------------------


def skinny_mm_reference(a: Tensor, b: Tensor, activation: str, ones: bool) -> Tensor:
    t = _act(a, activation) @ b  # (B, r)
    return torch.cat([t, t.new_ones(t.shape[0], 1)], dim=1) if ones else t  # (B, r [+ 1])


def wide_mm_reference(t: Tensor, w: Tensor, pre: Tensor | None, activation: str) -> Tensor:
    y = t @ w  # (B, N)
    return torch.ops.aten.gelu_backward(y, pre) if activation == "gelu" else y


def skinny_tmm_reference(a: Tensor, g: Tensor, activation: str) -> Tensor:
    return (_act(a, activation).T @ g).contiguous()  # (K, r)


# ---- ops -------------------------------------------------------------------------------------


@torch.library.custom_op("comera::skinny_mm", mutates_args=())
def skinny_mm(a: Tensor, b: Tensor, activation: str, ones: bool, use_triton: bool) -> Tensor:
    """``[act(a) @ b, 1]``: a (B, K), b (K, r) -> (B, r [+ 1])."""
    _check_mm(a, b, 1)
    _check_act(activation)
    if not use_triton:
        return skinny_mm_reference(a, b, activation, ones)
    ensure_triton([a, b], "comera::skinny_mm (Triton)")
    from engine.kernels.triton_gemm import matmul

    return matmul(a[None], b[None], gelu_a=activation == "gelu", ones=ones)[0]


@skinny_mm.register_fake
def _(a, b, activation, ones, use_triton):
    _check_mm(a, b, 1)
    return a.new_empty(a.shape[0], b.shape[1] + int(ones))


@torch.library.custom_op("comera::wide_mm", mutates_args=())
def wide_mm(t: Tensor, w: Tensor, pre: Tensor | None, activation: str, use_triton: bool) -> Tensor:
    """``(t @ w) * act'(pre)``: t (B, r), w (r, N), pre (B, N) -> (B, N)."""
    _check_mm(t, w, 1)
    _check_act(activation)
    torch._check(
        activation == "none" or (pre is not None and pre.shape == (t.shape[0], w.shape[1])),
        lambda: f"activation {activation!r} needs pre of shape {(t.shape[0], w.shape[1])}",
    )
    if not use_triton:
        return wide_mm_reference(t, w, pre, activation)
    ensure_triton([t, w], "comera::wide_mm (Triton)")
    from engine.kernels.triton_gemm import matmul

    p = pre[None] if activation == "gelu" else None
    return matmul(t[None], w[None], pre=p)[0]


@wide_mm.register_fake
def _(t, w, pre, activation, use_triton):
    _check_mm(t, w, 1)
    return t.new_empty(t.shape[0], w.shape[1])


@torch.library.custom_op("comera::skinny_tmm", mutates_args=())
def skinny_tmm(a: Tensor, g: Tensor, activation: str, use_triton: bool) -> Tensor:
    """``act(a)^T @ g``: a (B, K), g (B, r) -> (K, r); the reduction runs over the B rows."""
    _check_mm(a, g, 0)
    _check_act(activation)
    if not use_triton:
        return skinny_tmm_reference(a, g, activation)
    ensure_triton([a, g], "comera::skinny_tmm (Triton)")
    from engine.kernels.triton_gemm import matmul

    return matmul(a.T[None], g[None], gelu_a=activation == "gelu")[0]


@skinny_tmm.register_fake
def _(a, g, activation, use_triton):
    _check_mm(a, g, 0)
    return a.new_empty(a.shape[1], g.shape[1])


# ---- autograd: the three ops are each other's gradients --------------------------------------


def _skinny_setup(ctx, inputs, output) -> None:
    a, b, activation, ones, use_triton = inputs
    ctx.save_for_backward(a, b)
    ctx.activation, ctx.use_triton = activation, use_triton


def _skinny_backward(ctx, d_out: Tensor):
    a, b = ctx.saved_tensors
    g = d_out[:, : b.shape[1]]  # (B, r): the ones column has no inputs
    act, tri = ctx.activation, ctx.use_triton
    d_a = (
        wide_mm(g, b.T, a if act == "gelu" else None, act, tri) if ctx.needs_input_grad[0] else None
    )
    d_b = skinny_tmm(a, g, act, tri) if ctx.needs_input_grad[1] else None
    return d_a, d_b, None, None, None


def _wide_setup(ctx, inputs, output) -> None:
    t, w, pre, activation, use_triton = inputs
    ctx.save_for_backward(t, w, pre)
    ctx.activation, ctx.use_triton = activation, use_triton


def _wide_backward(ctx, d_out: Tensor):
    t, w, pre = ctx.saved_tensors
    if ctx.needs_input_grad[2]:
        raise NotImplementedError("comera::wide_mm is not differentiable with respect to pre")
    g = torch.ops.aten.gelu_backward(d_out, pre) if ctx.activation == "gelu" else d_out  # (B, N)
    tri = ctx.use_triton
    d_t = skinny_mm(g, w.T, "none", False, tri) if ctx.needs_input_grad[0] else None
    d_w = skinny_tmm(t, g, "none", tri) if ctx.needs_input_grad[1] else None
    return d_t, d_w, None, None, None


def _tmm_setup(ctx, inputs, output) -> None:
    a, g, activation, use_triton = inputs
    ctx.save_for_backward(a, g)
    ctx.activation, ctx.use_triton = activation, use_triton


def _tmm_backward(ctx, d_out: Tensor):
    a, g = ctx.saved_tensors
    act, tri = ctx.activation, ctx.use_triton
    d_a = (
        wide_mm(g, d_out.T, a if act == "gelu" else None, act, tri)
        if ctx.needs_input_grad[0]
        else None
    )
    d_g = skinny_mm(a, d_out, act, False, tri) if ctx.needs_input_grad[1] else None
    return d_a, d_g, None, None


skinny_mm.register_autograd(_skinny_backward, setup_context=_skinny_setup)
wide_mm.register_autograd(_wide_backward, setup_context=_wide_setup)
skinny_tmm.register_autograd(_tmm_backward, setup_context=_tmm_setup)
