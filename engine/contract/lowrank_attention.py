"""Self-attention whose q, k, v and output projections are TT-linears, run in rank space.

In the fast path (:mod:`engine.nn.premerge`) every TT-linear is held as its merged halves,
``W^T = L R`` with ``L (N, r)``, ``R (r, M)``, so ``q = T_q R_q + b_q`` with
``T_q = x L_q (n, r_q)``, and the same for ``k``, ``v``. Per head ``h`` (columns
``h E .. (h + 1) E`` of ``R``, ``E`` the head width), with ``[T, 1]`` the factor and a column
of ones when the layer has a bias::

    q_h k_h^T / sqrt(E) = [T_q, 1] C_h T_k^T + (a term constant along the keys)
    C_h  = [R_q,h; b_q,h] R_k,h^T / sqrt(E)                 (r_q [+ 1], r_k)
    P_h  = softmax(...)        y_h = P_h v_h = Z_h [R_v,h; b_v,h]
    Z_h  = P_h [T_v, 1]        (S, r_v [+ 1])
    u    = y L_o = sum_h Z_h W_h,   W_h = [R_v,h; b_v,h] L_o,h     (r_v [+ 1], r_o)

and the output projection is ``u R_o + b_o``. The term constant along the keys,
``q_h b_k,h``, cancels in the softmax: the key bias changes nothing, so its gradient is exactly
zero (returned as such). Nothing of width ``D`` is ever formed but the input ``x`` and the
output: the second products of q, k, v, the head split and merge copies and the output
projection's first product are gone, and the two attention products contract over ``r``
instead of ``E``. For the MNLI model (``r = 32`` padded, ``E = 64``) that is 2.4x fewer
multiply-adds than :class:`engine.nn.attention.AttentionFunction` plus the four projections'
rank-sized products (:func:`lowrank_pays` is the cost model that decides).

Layout: rows of a batch are ``(s, h)`` pairs, so scores are ``(B, S H, T)``, one ``bmm`` over
the batch with the per-sequence factors ``T_k (S, r_k)`` shared by all heads. The padding mask
and the dropout mask are the standard path's, read in this layout through a transposed view
(the dropout mask is drawn in ``(B H, S, T)`` order, so both paths draw the same masks).

Backward, with ``g = dZ / (1 - p)`` and ``Pm = P * m``::

    dW = Z^T du      dZ = du W^T      dT_v = Pm^T g      dP = (g T_v^T) * m
    dS = P * (dP - rowsum(dP * P))    dQ = dS T_k        dT_k = dS^T Q     (Q = [T_q, 1] C)
    dT_q = dQ C^T    dC = [T_q, 1]^T dQ     dx = [dT_q dT_k dT_v] [L_q L_k L_v]^T

``C`` and ``W`` are built from the halves by :func:`attention_factors` with autograd (small,
batch-independent tensors), so their gradients reach ``R_q, R_k, R_v, b_q, b_v, L_o`` the
ordinary way.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from engine.contract.execute import _skinny
from engine.nn.attention import masked_softmax
from engine.nn.dropout import as_bytes, dropout_mask

__all__ = [
    "AttentionGeometry",
    "LowRankAttentionFunction",
    "attention_factors",
    "lowrank_macs",
    "lowrank_pays",
    "standard_macs",
]


class AttentionGeometry(NamedTuple):
    batch: int  # B
    seq: int  # S (queries = keys: self-attention)
    heads: int  # H
    p: float  # dropout on the probabilities
    save_probs: bool  # keep P for backward (else rebuilt there from Q and T_k)
    out_ones: bool = False  # return [u, 1] (n, r_o + 1): the output projection has a bias


Ranks = tuple[int, int, int, int]  # (r_q, r_k, r_v, r_o)
Biases = tuple[bool, bool, bool]  # whether q, k, v have a bias


def lowrank_pays(n: int, geo: AttentionGeometry, d: int, ranks: Ranks, biases: Biases) -> bool:
    """Whether the rank-space attention takes fewer multiply-adds than the standard one.

    ``ranks`` are ``(r_q, r_k, r_v, r_o)``, ``biases`` whether q, k, v have one. Both sides
    share ``x L`` of q, k, v and the output's second product, which are left out; the standard
    side has the second products of q, k, v (the bias as one more rank), ``q k^T``, ``P v`` and
    the output's ``y L_o``; this side ``Q = [T_q, 1] C``, ``Q T_k^T``, ``P [T_v, 1]``, ``Z W``.
    """
    return lowrank_macs(n, geo, d, ranks, biases) < standard_macs(n, geo, d, ranks, biases)


def standard_macs(n: int, geo: AttentionGeometry, d: int, ranks: Ranks, biases: Biases) -> int:
    """Multiply-adds of the standard path that :func:`lowrank_pays` compares."""
    rq, rk, rv, ro = ranks
    second = (rq + biases[0] + rk + biases[1] + rv + biases[2]) * d
    return n * (second + 2 * geo.heads * geo.seq * (d // geo.heads) + d * ro)


def lowrank_macs(n: int, geo: AttentionGeometry, d: int, ranks: Ranks, biases: Biases) -> int:
    """Multiply-adds of the rank-space path that :func:`lowrank_pays` compares."""
    rq, rk, rv, ro = ranks
    rq1, rv1, h = rq + biases[0], rv + biases[2], geo.heads
    return n * h * (rq1 * rk + geo.seq * (rk + rv1) + rv1 * ro)


def attention_factors(
    rq: Tensor, rk: Tensor, rv: Tensor, bq: Tensor | None, bv: Tensor | None, lo: Tensor, heads: int
) -> tuple[Tensor, Tensor]:
    """``C`` (r_q [+ 1], H r_k) and ``W`` (H (r_v [+ 1]), r_o) of the module doc, from the
    halves ``R_q (r_q, D)``, ``R_k``, ``R_v``, the biases and ``L_o (D, r_o)``."""
    d = rk.shape[1]
    e = d // heads
    if bq is not None:
        rq = torch.cat([rq, bq.unsqueeze(0)])  # (r_q + 1, D)
    if bv is not None:
        rv = torch.cat([rv, bv.unsqueeze(0)])  # (r_v + 1, D)
    rq_h = rq.view(-1, heads, e).transpose(0, 1)  # (H, r_q [+ 1], E)
    rk_h = rk.view(-1, heads, e).permute(1, 2, 0)  # (H, E, r_k)
    c = torch.bmm(rq_h, rk_h).mul(1.0 / math.sqrt(e))  # (H, r_q [+ 1], r_k)
    rv_h = rv.view(-1, heads, e).transpose(0, 1)  # (H, r_v [+ 1], E)
    w = torch.bmm(rv_h, lo.view(heads, e, -1))  # (H, r_v [+ 1], r_o)
    return c.transpose(0, 1).reshape(c.shape[1], -1), w.reshape(-1, w.shape[2])


def _bshd(mask: Tensor, geo: AttentionGeometry) -> Tensor:
    """A ``(B H, S, T)`` tensor as its ``(B, S, H, T)`` view (transposed, not copied)."""
    b, s, h = geo.batch, geo.seq, geo.heads
    return mask.view(b, h, s, s).transpose(1, 2)


def _keep_bshd(keep: Tensor | None) -> Tensor | None:
    """A padding mask broadcastable to ``(B, H, S, T)`` as one broadcastable to ``(B, S, H, T)``."""
    if keep is None:
        return None
    return keep.reshape((1,) * (4 - keep.dim()) + tuple(keep.shape)).transpose(1, 2)


def _probs(qp: Tensor, tk: Tensor, keep: Tensor | None, geo: AttentionGeometry) -> Tensor:
    """``P`` (B, S H, T) from ``Q`` (B, S H, r_k) and ``T_k`` (B, T, r_k)."""
    b, s, h = geo.batch, geo.seq, geo.heads
    scores = torch.bmm(qp, tk.mT)  # (B, S H, T)
    return masked_softmax(scores, keep, (b, s, h, s))  # (B, S H, T)


class LowRankAttentionFunction(torch.autograd.Function):
    """``u = y L_o`` (n, r_o) of the module doc, for ``x (n, N)``, ``n = B S`` rows, or
    ``[u, 1]`` (n, r_o + 1) with ``geo.out_ones``, for ``[u, 1] [R_o; b_o]``.

    ``lq, lk, lv (N, r_*)`` are the halves of q, k, v, ``c``, ``w`` from
    :func:`attention_factors`; ``k_bias`` only gets its (zero) gradient; ``keep`` is the
    padding mask (broadcastable to ``(B, H, S, T)``, True = attend) or None.
    """

    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        lq: Tensor,
        lk: Tensor,
        lv: Tensor,
        c: Tensor,
        w: Tensor,
        k_bias: Tensor | None,
        keep: Tensor | None,
        geo: AttentionGeometry,
    ) -> Tensor:
        b, s, h = geo.batch, geo.seq, geo.heads
        rq, rk, rv = lq.shape[1], lk.shape[1], lv.shape[1]
        q_ones, v_ones = c.shape[0] > rq, w.shape[0] > h * rv
        lcat = torch.cat([lq, lk, lv], dim=1)  # (N, r_q + r_k + r_v)
        t = _skinny(x, lcat)  # (n, r_q + r_k + r_v)
        tq, tk, tv = t.split([rq, rk, rv], dim=1)  # (n, r_*) views
        tq1 = torch.cat([tq, tq.new_ones(tq.shape[0], 1)], 1) if q_ones else tq  # (n, r_q [+ 1])
        tv1 = torch.cat([tv, tv.new_ones(tv.shape[0], 1)], 1) if v_ones else tv  # (n, r_v [+ 1])
        qp = (tq1 @ c).view(b, s * h, rk)  # (B, S H, r_k)
        tk3, tv3 = tk.view(b, s, rk), tv1.view(b, s, -1)  # (B, T, r_k), (B, T, r_v [+ 1])
        keep_b = _keep_bshd(keep)
        prob = _probs(qp, tk3, keep_b, geo)  # (B, S H, T)
        mask = None
        if geo.p > 0.0:
            mask = dropout_mask((b * h, s, s), 1.0 - geo.p, x.device)  # (B H, S, T) bool
            pm = torch.mul(
                prob.view(b, s, h, s),
                _bshd(as_bytes(mask), geo),
                out=torch.empty_like(prob).view(b, s, h, s),
            )
            pm = pm.view(b, s * h, s)  # (B, S H, T)
            z = torch.bmm(pm, tv3).mul_(1.0 / (1.0 - geo.p))  # (B, S H, r_v [+ 1])
            del pm
        else:
            z = torch.bmm(prob, tv3)  # (B, S H, r_v [+ 1])
        zf = z.view(b * s, -1)  # (n, H (r_v [+ 1]))
        ro = w.shape[1]
        u = x.new_empty(b * s, ro + geo.out_ones)  # (n, r_o [+ 1])
        torch.mm(zf, w, out=u[:, :ro])  # (n, r_o) written in place (row stride r_o + 1)
        if geo.out_ones:
            u[:, ro].fill_(1.0)  # [u, 1]: the output bias rides along as one more rank
        ctx.geo, ctx.ranks = geo, (rq, rk, rv)
        ctx.k_bias = None if k_bias is None else k_bias.shape
        ctx.save_for_backward(
            x, lcat, tq1, tk3, tv3, c, w, qp, zf, keep_b, mask, prob if geo.save_probs else None
        )
        return u

    @staticmethod
    def backward(ctx, du: Tensor):
        x, lcat, tq1, tk3, tv3, c, w, qp, zf, keep_b, mask, prob = ctx.saved_tensors
        geo = ctx.geo
        du = du[:, : w.shape[1]]  # (n, r_o): the ones column is constant
        b, s, h = geo.batch, geo.seq, geo.heads
        rq, rk, rv = ctx.ranks
        n = b * s
        if prob is None:
            prob = _probs(qp, tk3, keep_b, geo)  # (B, S H, T) rebuilt
        dw = zf.T @ du  # (H (r_v [+ 1]), r_o)
        g = (du @ w.T).view(b, s * h, -1)  # (B, S H, r_v [+ 1])
        if mask is not None:
            g.mul_(1.0 / (1.0 - geo.p))
            m01 = _bshd(as_bytes(mask), geo).to(prob.dtype)  # (B, S, H, T) 0/1, transposed
            pm = torch.mul(
                prob.view(b, s, h, s), m01, out=torch.empty_like(prob).view(b, s, h, s)
            ).view(b, s * h, s)  # (B, S H, T)
        else:
            m01, pm = None, prob
        d_tv = torch.bmm(pm.mT, g)  # (B, T, r_v [+ 1])
        del pm
        dp = torch.bmm(g, tv3.mT)  # (B, S H, T)
        if m01 is not None:
            dp.view(b, s, h, s).mul_(m01)
            del m01
        ds = torch._softmax_backward_data(dp, prob, -1, prob.dtype)  # (B, S H, T)
        del dp, prob
        dqp = torch.bmm(ds, tk3).view(n, h * rk)  # (n, H r_k)
        d_tk = torch.bmm(ds.mT, qp)  # (B, T, r_k)
        del ds
        d_tq = dqp @ c[:rq].T  # (n, r_q)
        d_t = torch.cat([d_tq, d_tk.view(n, rk), d_tv.view(n, -1)[:, :rv]], dim=1)  # (n, r_*)
        dc = tq1.T @ dqp  # (r_q [+ 1], H r_k)
        dx = d_t @ lcat.T if ctx.needs_input_grad[0] else None  # (n, N)
        d_lcat = (d_t.T @ x).T  # (N, r_q + r_k + r_v)
        dlq, dlk, dlv = d_lcat.split([rq, rk, rv], dim=1)
        dkb = x.new_zeros(ctx.k_bias) if ctx.k_bias is not None else None  # exactly zero
        return dx, dlq, dlk, dlv, dc, dw, dkb, None, None
