"""TT-linear products from halves merged elsewhere (a group merge), with hand-written backward.

The fused plan of :mod:`engine.contract.execute` merges a layer's cores inside its own
autograd function. When the halves ``L`` (N, r) and ``R`` (r, M) come from a batched group
merge (:class:`engine.contract.batched.GroupMergeFunction`), what is left per layer is the
batch-dependent part only, with the same products, orientation choices and saved tensors as
:class:`~engine.contract.execute.TTLinearFunction` (torch ops)::

    T = [act(x) L, 1]   (B, r + 1)        y = T [R; b]   (B, M)
    u = dy R^T          (B, r)            dx = u L^T (act' applied for gelu)
    dL = act(x)^T u     (N, r)            [dR; db] = T^T dy

and ``dL``, ``dR`` flow back to the group merge. Under ``torch.autocast`` every function runs
its products in the autocast dtype (inputs cast on entry, the output gradient in backward; the
gradients autograd hands back are cast to the inputs' dtypes), so float32 halves and biases
stay the master copies. :class:`SiblingLinearFunction` does ``S``
layers that read the same input at once (attention's q, k, v): one ``(B, N) x (N, S r)``
product instead of ``S`` skinny ones, and one ``dx`` GEMM. :class:`PremergedFFNFunction` is
:class:`engine.contract.ffn.TTFFNFunction` (row-blocked ``fc2(gelu(fc1(x)))``, no (B, F)
tensor kept) on given halves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.contract.execute import _first_product, _skinny, with_bias
from engine.contract.lowrank_saved import recomputing, tag_output

__all__ = [
    "PremergedLinearFunction",
    "PremergedFFNFunction",
    "SiblingLinearFunction",
    "autocast_dtype",
    "cast_all",
    "no_autocast",
]


def _act(x: Tensor, act: str | None) -> Tensor:
    return F.gelu(x) if act == "gelu" else x


def autocast_dtype(t: Tensor) -> torch.dtype | None:
    """The autocast dtype for ``t``'s device when autocast is on there, else ``None``."""
    dev = t.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def cast_all(dtype: torch.dtype | None, *ts: Tensor | None) -> list[Tensor | None]:
    """``ts`` in ``dtype`` (floating tensors only; ``None`` dtype: unchanged)."""
    if dtype is None:
        return list(ts)
    return [t.to(dtype) if t is not None and t.is_floating_point() else t for t in ts]


def no_autocast(t: Tensor) -> torch.autocast:
    return torch.autocast(t.device.type, enabled=False)


class PremergedLinearFunction(torch.autograd.Function):
    """``y = act(x) L R + b`` for ``x (B, N)``, ``L (N, r)``, ``R (r, M)``, ``b (M,)``."""

    @staticmethod
    def forward(
        ctx, x: Tensor, left: Tensor, right: Tensor, bias: Tensor | None, act: str | None
    ) -> Tensor:
        ctx.dtype = autocast_dtype(x)
        x, left, right, bias = cast_all(ctx.dtype, x, left, right, bias)
        with no_autocast(x):
            t1 = _first_product(_act(x, act), left, with_ones=bias is not None)  # (B, r [+ 1])
            rb = with_bias(right, bias)  # (r [+ 1], M)
            y = t1 @ rb  # (B, M)
        if recomputing() and any(ctx.needs_input_grad):
            tag_output(y, t1, rb)  # consumers keep (t1, rb): engine.contract.lowrank_saved
        ctx.act = act
        ctx.save_for_backward(x, t1, left, right)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, t1, left, right = ctx.saved_tensors
        r = left.shape[1]
        dy = dy.to(t1.dtype)
        u1 = _skinny(dy, right.T).contiguous()  # (B, r)
        dx = u1 @ left.T if ctx.needs_input_grad[0] else None  # (B, N)
        d_rb = t1.T @ dy  # (r [+ 1], M)
        d_left = (u1.T @ _act(x, ctx.act)).T  # (N, r)
        if ctx.act == "gelu" and dx is not None:
            dx = torch.ops.aten.gelu_backward(dx, x)  # (B, N)
        dbias = d_rb[r] if t1.shape[1] > r else None  # (M,)
        return dx, d_left, d_rb[:r], dbias, None


class SiblingLinearFunction(torch.autograd.Function):
    """``y_s = x L_s R_s + b_s`` for ``S`` layers on one input: ``(S, B, M)``.

    ``lefts (S, N, r)``, ``rights (S, r, M)`` and ``biases (S, M)`` (or None) are stacked.
    """

    @staticmethod
    def forward(ctx, x: Tensor, lefts: Tensor, rights: Tensor, biases: Tensor | None) -> Tensor:
        S, N, r = lefts.shape
        x, lefts, rights, biases = cast_all(autocast_dtype(x), x, lefts, rights, biases)
        with no_autocast(x):
            cat_t = lefts.permute(0, 2, 1).reshape(S * r, N)  # (S r, N) rows: member, rank
            t = torch.mm(cat_t, x.T).view(S, r, -1)  # (S, r, B) transposed T of every member
            if biases is None:
                y = torch.bmm(t.mT, rights)  # (S, B, M)
            else:
                y = torch.baddbmm(biases.unsqueeze(1), t.mT, rights)  # (S, B, M)
        ctx.has_bias = biases is not None
        ctx.save_for_backward(x, t, cat_t, rights)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, t, cat_t, rights = ctx.saved_tensors
        S, r, _ = t.shape
        dy = dy.to(t.dtype)
        u_t = torch.bmm(rights, dy.mT)  # (S, r, B)  u_s^T = R_s dy_s^T
        u_cat = u_t.reshape(S * r, -1)  # (S r, B)
        dx = (u_cat.T @ cat_t) if ctx.needs_input_grad[0] else None  # (B, N)
        d_left = (u_cat @ x).view(S, r, -1).mT  # (S, N, r)
        d_right = torch.bmm(t, dy)  # (S, r, M)
        dbias = dy.sum(dim=1) if ctx.has_bias else None  # (S, M)
        return dx, d_left, d_right, dbias


class PremergedFFNFunction(torch.autograd.Function):
    """``fc2(gelu(fc1(x)))`` for ``x (B, N)`` from the halves of both layers, row-blocked."""

    @staticmethod
    def forward(ctx, x, l1, r1, b1, l2, r2, b2, block: int):
        x, l1, r1, b1, l2, r2, b2 = cast_all(autocast_dtype(x), x, l1, r1, b1, l2, r2, b2)
        with no_autocast(x):
            return PremergedFFNFunction._forward(ctx, x, l1, r1, b1, l2, r2, b2, block)

    @staticmethod
    def _forward(ctx, x, l1, r1, b1, l2, r2, b2, block: int):
        rb1 = with_bias(r1, b1)  # (r1 [+ 1], F)
        t1 = _first_product(x, l1, with_ones=b1 is not None)  # (B, r1 [+ 1])
        rows, k2 = x.shape[0], l2.shape[1]
        t2 = x.new_empty(rows, k2 + (b2 is not None))  # (B, r2 [+ 1])
        for lo in range(0, rows, block):
            h = t1[lo : lo + block] @ rb1  # (blk, F)
            t2[lo : lo + block, :k2] = torch.ops.aten.gelu_(h) @ l2  # (blk, r2)
        if b2 is not None:
            t2[:, k2] = 1.0
        y = t2 @ with_bias(r2, b2)  # (B, D)
        ctx.block, ctx.rb1 = block, rb1
        ctx.save_for_backward(x, t1, t2, l1, l2, r2)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, t1, t2, l1, l2, r2 = ctx.saved_tensors
        rb1, block = ctx.rb1, ctx.block
        del ctx.rb1
        k1, k2 = l1.shape[1], l2.shape[1]
        rows, hidden = x.shape[0], rb1.shape[1]
        dy = dy.to(t2.dtype)
        u2 = _skinny(dy, r2.T).contiguous()  # (B, r2)
        d_rb2 = t2.T @ dy  # (r2 [+ 1], D)
        d_l2_t = x.new_zeros(k2, hidden)  # (r2, F): u^T g, MKL's faster orientation here
        d_rb1 = x.new_zeros(t1.shape[1], hidden)  # (r1 [+ 1], F)
        u1 = x.new_empty(rows, k1)  # (B, r1)
        l2_t, r1_t = l2.T, rb1[:k1].T  # (r2, F), (F, r1)
        for lo in range(0, rows, block):
            blk = slice(lo, lo + block)
            h = t1[blk] @ rb1  # (blk, F) rebuilt
            dh = torch.ops.aten.gelu_backward(u2[blk] @ l2_t, h)  # (blk, F)
            d_l2_t.addmm_(u2[blk].T, torch.ops.aten.gelu_(h))  # (r2, F): h no longer needed
            u1[blk] = _skinny(dh, r1_t)  # (blk, r1)
            d_rb1.addmm_(t1[blk].T, dh)  # (r1 [+ 1], F)
        dx = u1 @ l1.T if ctx.needs_input_grad[0] else None  # (B, N)
        d_l1 = (u1.T @ x).T  # (N, r1)
        db1 = d_rb1[k1] if t1.shape[1] > k1 else None  # (F,)
        db2 = d_rb2[k2] if t2.shape[1] > k2 else None  # (D,)
        return dx, d_l1, d_rb1[:k1], db1, d_l2_t.T, d_rb2[:k2], db2, None
