"""A TT feed-forward block ``fc2(gelu(fc1(x)))`` computed row block by row block.

With both layers in merged form (``W_i^T = L_i R_i``, biases as an extra rank, see
:mod:`engine.contract.execute`)::

    T1 = [x L1, 1]           (B, r1 + 1)       h = T1 [R1; b1]     (B, F)
    T2 = [gelu(h) L2, 1]     (B, r2 + 1)       y = T2 [R2; b2]     (B, D)

The wide tensors ``h``, ``gelu(h)`` and their gradients (B, F) are only ever needed one row
block at a time: the forward builds ``T2`` block by block, and the backward rebuilds each
block of ``h`` from the saved ``T1`` (one (blk, r1 + 1) x (r1 + 1, F) product) and then::

    dL2 += gelu(h)^T u2          u2 = dy R2^T      (B, r2)
    dh   = gelu'(h) * (u2 L2^T)
    u1   = dh R1^T               (B, r1)           dR1 += T1^T dh   (db1: the ones column)

so nothing of size (B, F) is kept: what backward keeps is ``x``, ``T1`` and ``T2`` (a
(B, 3072) x 4-byte ``h`` is 48 MiB per layer at 32 x 128 tokens, the three factors together
1.5 MiB). A block is :data:`BLOCK_ELEMENTS` entries (1024 rows at F = 3072, 12 MiB per
temporary): on the 2-core Xeon this was tuned on, 1024 rows ran the block 15% faster than 341
at 1024 rows and 2-8% at 4096 (fewer, larger GEMMs beat a cache-sized block there), and
keeping ``h`` from the forward instead of rebuilding it made the whole step slower (206 vs
197 ms at batch 8). The multiply-adds are those of the two layers plus the rebuild of ``h``.
Gate and core gradients come from the same merge backward as a single layer
(:func:`engine.contract.execute.param_grads`).
"""

from __future__ import annotations

import torch

from engine.contract.execute import (
    TTLinearMeta,
    _first_product,
    _skinny,
    merge_gated,
    param_grads,
    with_bias,
)
from engine.contract.plan import Side

__all__ = ["BLOCK_ELEMENTS", "TTFFNFunction", "block_rows"]

BLOCK_ELEMENTS = 3 << 20  # entries of one (blk, F) temporary: 12 MiB in float32 (module doc)
LayerSpec = tuple[TTLinearMeta, tuple[Side, Side], int]  # meta, plan sides, parameter count


def block_rows(hidden: int) -> int:
    """Rows per block for a hidden width ``hidden``."""
    return max(1, BLOCK_ELEMENTS // hidden)


class TTFFNFunction(torch.autograd.Function):
    """``fc2(gelu(fc1(x)))`` for ``x (B, N)``; ``params = (*cores1, *gates1, *cores2, *gates2)``."""

    @staticmethod
    def forward(ctx, x, b1, b2, spec1: LayerSpec, spec2: LayerSpec, block: int, *params):
        (meta1, dirs1, n1), (meta2, dirs2, _) = spec1, spec2
        c1 = len(meta1.in_modes) + len(meta1.out_modes)
        c2 = len(meta2.in_modes) + len(meta2.out_modes)
        m1 = merge_gated(meta1, dirs1, params[:c1], params[c1:n1])
        m2 = merge_gated(meta2, dirs2, params[n1 : n1 + c2], params[n1 + c2 :])
        rb1 = with_bias(m1.right, b1)  # (r1 [+ 1], F)
        t1 = _first_product(x, m1.left, with_ones=b1 is not None)  # (B, r1 [+ 1])
        rows, r2 = x.shape[0], m2.left.shape[1]
        t2 = x.new_empty(rows, r2 + (b2 is not None))  # (B, r2 [+ 1])
        for lo in range(0, rows, block):
            h = t1[lo : lo + block] @ rb1  # (blk, F)
            t2[lo : lo + block, :r2] = torch.ops.aten.gelu_(h) @ m2.left  # (blk, r2)
        if b2 is not None:
            t2[:, r2] = 1.0
        y = t2 @ with_bias(m2.right, b2)  # (B, D)
        ctx.specs, ctx.block, ctx.merged, ctx.rb1 = (spec1, spec2), block, (m1, m2), rb1
        ctx.save_for_backward(x, t1, t2)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, t1, t2 = ctx.saved_tensors
        (meta1, dirs1, _), (meta2, dirs2, _) = ctx.specs
        m1, m2 = ctx.merged
        rb1, block = ctx.rb1, ctx.block
        r1, r2 = m1.left.shape[1], m2.left.shape[1]
        rows, hidden = x.shape[0], rb1.shape[1]
        u2 = _skinny(dy, m2.right.T).contiguous()  # (B, r2)
        d_right2 = t2.T @ dy  # (r2 [+ 1], D)
        d_left2 = x.new_zeros(hidden, r2)  # (F, r2)
        d_right1 = x.new_zeros(t1.shape[1], hidden)  # (r1 [+ 1], F)
        u1 = x.new_empty(rows, r1)  # (B, r1)
        left2_t, right1_t = m2.left.T, m1.right.T  # (r2, F), (F, r1)
        for lo in range(0, rows, block):
            blk = slice(lo, lo + block)
            h = t1[blk] @ rb1  # (blk, F) rebuilt
            dh = torch.ops.aten.gelu_backward(u2[blk] @ left2_t, h)  # (blk, F)
            d_left2.addmm_(torch.ops.aten.gelu_(h).T, u2[blk])  # (F, r2): h no longer needed
            u1[blk] = _skinny(dh, right1_t)  # (blk, r1)
            d_right1.addmm_(t1[blk].T, dh)  # (r1 [+ 1], F)
        dx = u1 @ m1.left.T if ctx.needs_input_grad[0] else None  # (B, N)
        d_left1 = (u1.T @ x).T  # (N, r1)
        db1 = d_right1[r1] if t1.shape[1] > r1 else None  # (F,)
        db2 = d_right2[r2] if t2.shape[1] > r2 else None  # (D,)
        cores1, gates1 = param_grads(meta1, dirs1, m1, d_left1, d_right1[:r1])
        cores2, gates2 = param_grads(meta2, dirs2, m2, d_left2, d_right2[:r2])
        del ctx.merged, ctx.rb1
        return (dx, db1, db2, None, None, None, *cores1, *gates1, *cores2, *gates2)
