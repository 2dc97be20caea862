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
from engine.nn.dropout import as_bytes, dropout_mask

__all__ = ["AttentionFunction", "masked_softmax", "scaled_dot_product_attention"]


def _operands(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q / sqrt(E)``, ``k``, ``v`` as contiguous (BH, S|T, E) batches (one copy each)."""
    b, h, s, e = q.shape
    t = k.shape[2]
    q3 = torch.mul(q, 1.0 / math.sqrt(e), out=q.new_empty(b, h, s, e)).view(b * h, s, e)
    return q3, k.reshape(b * h, t, e), v.reshape(b * h, t, e)


def masked_softmax(scores: Tensor, keep: Tensor | None, shape4: tuple[int, ...]) -> Tensor:
    """``softmax(scores)`` over the last dimension, ``scores`` (modified in place) viewed as
    ``shape4`` where ``keep`` (broadcastable to ``shape4``, True = attend) is False set to
    ``-inf`` first; rows without a key are 0, as SDPA's."""
    dead = None
    if keep is not None and (keep.device.type != "cpu" or not bool(keep.all())):
        scores.view(shape4).masked_fill_(keep.logical_not(), float("-inf"))
        dead = keep.logical_not().all(dim=-1, keepdim=True)  # (.., 1) rows with no key
    prob = torch.softmax(scores, dim=-1)  # (scores.shape)
    if dead is not None:
        prob.view(shape4).masked_fill_(dead, 0.0)  # fully masked rows -> 0
    return prob


def _probs(q3: Tensor, k3: Tensor, keep: Tensor | None, shape4: tuple[int, ...]) -> Tensor:
    """``P = softmax(q k^T / sqrt(E))`` (BH, S, T), masked; rows without a key are 0."""
    scores = torch.bmm(q3, k3.transpose(1, 2))  # (BH, S, T)
    return masked_softmax(scores, keep, shape4)  # (BH, S, T)


class AttentionFunction(torch.autograd.Function):
    """Attention with dropout that saves ``q, k, v``, ``P`` and a bool dropout mask.

    Inside :func:`engine.contract.lowrank_saved.recompute_tt_outputs` it saves ``q, k, v``
    as given (TT-linear outputs, so kept as rank-r factors) and, unless ``keep_probs``, not
    ``P``: backward rebuilds the operands and ``P`` (one more ``q k^T`` and softmax) and keeps
    only the bool mask. ``keep_probs`` trades one (B H, S, T) float tensor per layer for that
    ``q k^T`` and softmax.
    """

    @staticmethod
    def forward(
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        keep: Tensor | None,
        p: float,
        keep_probs: bool = False,
    ) -> Tensor:
        b, h, s, e = q.shape
        t = k.shape[2]
        q3, k3, v3 = _operands(q, k, v)  # (BH, S|T, E)
        prob = _probs(q3, k3, keep, (b, h, s, t))  # (BH, S, T)
        mask = None
        if p > 0.0:
            mask = dropout_mask(prob.shape, 1.0 - p, prob.device)  # (BH, S, T) bool, saved
            y = torch.bmm(prob * as_bytes(mask), v3)  # (BH, S, E)
            y.mul_(1.0 / (1.0 - p))
        else:
            y = torch.bmm(prob, v3)  # (BH, S, E)
        ctx.shape, ctx.p = (b, h, s, t, e), p
        ctx.rebuild = recomputing()
        if ctx.rebuild:  # q, k, v: TT-linear outputs, kept as rank-r factors; P rebuilt
            ctx.save_for_backward(q, k, v, keep, mask, prob if keep_probs else None)
        else:
            ctx.save_for_backward(q3, k3, v3, mask, prob)
        return y.view(b, h, s, e)  # (B, H, S, E)

    @staticmethod
    def backward(ctx, dy: Tensor):
        b, h, s, t, e = ctx.shape
        if ctx.rebuild:
            q, k, v, keep, mask, prob = ctx.saved_tensors
            q3, k3, v3 = _operands(q, k, v)  # (BH, S|T, E)
            if prob is None:
                prob = _probs(q3, k3, keep, (b, h, s, t))  # (BH, S, T)
        else:
            q3, k3, v3, mask, prob = ctx.saved_tensors
        g = dy.reshape(b * h, s, e)  # (BH, S, E)
        m01 = None
        if mask is not None:
            g = g * (1.0 / (1.0 - ctx.p))  # (BH, S, E)
            m01 = as_bytes(mask).to(prob.dtype)  # (BH, S, T) 0/1 (from uint8: vectorized)
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
        del dp, prob
        dq = torch.bmm(ds, k3).mul_(1.0 / math.sqrt(e))  # (BH, S, E)
        dk = torch.bmm(ds.transpose(1, 2), q3)  # (BH, T, E)  q3 holds q / sqrt(E)
        return dq.view(b, h, s, e), dk.view(b, h, t, e), dv.view(b, h, t, e), None, None, None


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Tensor | None = None,
    dropout_p: float = 0.0,
    keep_probs: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)``.

    ``keep`` is boolean (True = attend) or None. With dropout on a CPU tensor that needs
    gradients, runs :class:`AttentionFunction` (``keep_probs``: see there); otherwise torch's
    fused kernels.
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if keep is not None and keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool mask, got {keep.dtype}")
    if dropout_p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
    return AttentionFunction.apply(q, k, v, keep, dropout_p, keep_probs)  # (B, H, S, E)
