"""Scaled dot-product attention with dropout, keeping little for backward (CPU).

For ``q (B, H, S, E)``, ``k, v (B, H, T, E)``, a boolean ``keep`` broadcastable to
``(B, H, S, T)`` (True = attend) and dropout ``p``::

    P = softmax(q k^T / sqrt(E) + log keep)      (B, H, S, T); rows with no key: P = 0
    y = (P * m) v / (1 - p)                       m ~ Bernoulli(1 - p), one bool per entry

which is ``F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)``. On CPU
with dropout torch runs that in its unfused "math" path: a float ``bernoulli_`` mask (two
Mersenne-twister draws per entry, in one thread) and autograd keeping the softmax output,
the float mask and the dropped probabilities, three ``(B, H, S, T)`` float tensors per layer
(75 MiB at B = 32, S = 128, H = 12). :class:`AttentionFunction` keeps ``P`` and the bool mask
(``1 + 1/4`` of one such tensor), draws the mask with one draw per entry
(:func:`engine.nn.dropout.dropout_mask`) and folds ``1 / (1 - p)`` and ``1 / sqrt(E)`` into
the smaller GEMM operands. Backward, with ``g = dy / (1 - p)`` and ``Pm = P * m``::

    dv = Pm^T g        dP = (g v^T) * m        dS = P * (dP - rowsum(dP * P))
    dq = dS k / sqrt(E)                         dk = dS^T q / sqrt(E)

Without dropout, or off the CPU, :func:`scaled_dot_product_attention` calls torch's fused
kernels (flash attention on CPU, flash / memory-efficient on CUDA).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.contract.lowrank_saved import recomputing
from engine.nn.dropout import dropout_mask

__all__ = ["AttentionFunction", "scaled_dot_product_attention"]


class AttentionFunction(torch.autograd.Function):
    """Attention with dropout that saves ``q, k, v``, ``P`` and a bool dropout mask."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, p: float) -> Tensor:
        b, h, s, e = q.shape
        t = k.shape[2]
        scale = 1.0 / math.sqrt(e)
        q3 = torch.mul(q, scale, out=q.new_empty(b, h, s, e)).view(b * h, s, e)  # q / sqrt(E)
        k3 = k.reshape(b * h, t, e)  # (BH, T, E)  copy when k is a transposed view
        v3 = v.reshape(b * h, t, e)  # (BH, T, E)
        scores = torch.bmm(q3, k3.transpose(1, 2))  # (BH, S, T)
        dead = None
        if keep is not None and (keep.device.type != "cpu" or not bool(keep.all())):
            s4 = scores.view(b, h, s, t)  # (B, H, S, T)
            s4.masked_fill_(keep.logical_not(), float("-inf"))
            dead = keep.logical_not().all(dim=-1, keepdim=True)  # (.., 1) rows with no key
        prob = torch.softmax(scores, dim=-1)  # (BH, S, T)
        del scores
        if dead is not None:
            prob.view(b, h, s, t).masked_fill_(dead, 0.0)  # as SDPA: fully masked rows -> 0
        mask = None
        if p > 0.0:
            mask, m01 = dropout_mask(prob.shape, 1.0 - p, prob.device, 1.0, prob.dtype)
            y = torch.bmm(prob * m01, v3)  # (BH, S, E)  mask: bool (saved), m01: 0/1 float
            del m01
            y.mul_(1.0 / (1.0 - p))
        else:
            y = torch.bmm(prob, v3)  # (BH, S, E)
        ctx.shape, ctx.scale, ctx.p = (b, h, s, t, e), scale, p
        ctx.inputs_saved = recomputing()
        if ctx.inputs_saved:  # TT-linear outputs: kept as rank-r factors, copied again later
            ctx.save_for_backward(q, k, v, prob, mask)
        else:
            ctx.save_for_backward(q3, k3, v3, prob, mask)
        return y.view(b, h, s, e)  # (B, H, S, E)

    @staticmethod
    def backward(ctx, dy: Tensor):
        q3, k3, v3, prob, mask = ctx.saved_tensors
        b, h, s, t, e = ctx.shape
        if ctx.inputs_saved:
            q3 = torch.mul(q3, ctx.scale, out=q3.new_empty(b, h, s, e)).view(b * h, s, e)
            k3, v3 = k3.reshape(b * h, t, e), v3.reshape(b * h, t, e)  # (BH, T, E)
        g = dy.reshape(b * h, s, e)  # (BH, S, E)
        m01 = None
        if mask is not None:
            g = g * (1.0 / (1.0 - ctx.p))  # (BH, S, E)
            m01 = mask.to(prob.dtype)  # (BH, S, T) 0/1
            pm = prob * m01  # (BH, S, T)
        else:
            pm = prob  # (BH, S, T)
        dv = torch.bmm(pm.transpose(1, 2), g)  # (BH, T, E)
        del pm
        dp = torch.bmm(g, v3.transpose(1, 2))  # (BH, S, T)
        if m01 is not None:
            dp.mul_(m01)
            del m01
        ds = torch._softmax_backward_data(dp, prob, -1, prob.dtype)  # (BH, S, T)
        del dp
        dq = torch.bmm(ds, k3).mul_(ctx.scale)  # (BH, S, E)
        dk = torch.bmm(ds.transpose(1, 2), q3)  # (BH, T, E)  q3 holds q / sqrt(E)
        return dq.view(b, h, s, e), dk.view(b, h, t, e), dv.view(b, h, t, e), None, None


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None, dropout_p: float = 0.0
) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)``.

    ``keep`` is boolean (True = attend) or None. With dropout on a CPU tensor that needs
    gradients, runs :class:`AttentionFunction`; otherwise torch's fused kernels.
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if keep is not None and keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool mask, got {keep.dtype}")
    if dropout_p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
    return AttentionFunction.apply(q, k, v, keep, dropout_p)  # (B, H, S, E)
