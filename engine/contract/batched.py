"""Gate and merge the cores of many same-shaped TT-linears at once, with batched GEMMs.

A CoMERA transformer has dozens of TT-linears whose cores have identical shapes (the 24
attention projections and the classifier's first layer of the MNLI model share
``(12, 8, 8) -> (8, 8, 12)`` at rank 30). Merging each layer's halves on its own
(:func:`engine.contract.execute.merge_gated`) costs about 70 small ops per layer, forward and
backward, each dominated by dispatch rather than arithmetic at small batch. Here a *group* of
``G`` layers with equal core shapes is merged in one go: core ``k`` of every member is stacked
into ``(G, a_k, s_k, b_k)``, every chain step is one ``bmm`` and::

    L = merge_ltr(G_1 mu_1, .., G_d mu_d)        (G, N, r)   padded input rows dropped
    R = merge_rtl(G_{d+1} mu_{d+1}, .., G_K)     (G, r, M)   padded output columns dropped

with ``mu_k = g_k * 1[g_k > tau]`` (docs/method.md#rank-gates), applied to the first index of core
``k + 1`` (the same chain; for the middle bond it scales ``R``'s rows instead of ``L``'s
columns, so ``L R`` is unchanged). :class:`GroupMergeFunction` returns both
and its backward turns ``dL``, ``dR`` into every member's core and gate gradients with the
batched merge backward: the same maths as :func:`engine.tt.chain.merge_backward` and
:func:`engine.contract.execute.param_grads`, with a batch dimension in front.

*Rank padding* (``GroupSpec.rank_to``): the products that follow write ``(B, r)`` outputs
(``x L``, ``dy R^T``), and MKL's GEMM runs those at full speed only when ``r`` is a multiple
of 16: at ``r = 30`` and 1024-4096 rows ``x L`` takes 1.5-1.8x the time of ``r = 32``
(``python -m bench.skinny_gemm``). So the middle bond can be zero-padded to ``rank_to``: the
last input core gains zero columns and the first output core zero rows, ``L`` and ``R`` come
out ``(G, N, rank_to)`` and ``(G, rank_to, M)``, ``L R`` is unchanged, and the padded
entries' gradients are dropped in backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from engine.contract.plan import Side

__all__ = [
    "GroupSpec",
    "GroupMergeFunction",
    "merge_batched",
    "merge_batched_backward",
    "padded_rank",
]

PAD_MULTIPLE = 16  # MKL's fast skinny-output GEMMs (module doc)
PAD_FROM_ROWS = 256  # below this the products use the transposed form, fast at any rank


def merge_batched(cores: Sequence[Tensor], direction: Side) -> tuple[Tensor, list[Tensor]]:
    """:func:`engine.tt.chain.merge` of stacked cores ``(G, a, s, b)``: ``(G, a_0 prod s, b_K)``
    and the intermediates its backward needs."""
    G = cores[0].shape[0]
    if direction == "ltr":
        p = cores[0].reshape(G, -1, cores[0].shape[-1])  # (G, a_0 s_1, a_1)
        saved = [p]
        for g in cores[1:]:
            _, a, s, b = g.shape
            p = torch.bmm(p.reshape(G, -1, a), g.reshape(G, a, s * b))  # (G, rows, s b)
            p = p.reshape(G, -1, b)  # (G, rows s, b)
            saved.append(p)
        return p, saved[:-1]
    last = cores[-1]
    q = last.reshape(G, last.shape[1], -1)  # (G, a_{K-1}, s_K a_K)
    saved = [q]
    for g in reversed(cores[:-1]):
        _, a, s, b = g.shape
        q = torch.bmm(g.reshape(G, a * s, b), q).reshape(G, a, -1)  # (G, a, s .. s_K a_K)
        saved.append(q)
    return q.reshape(G, -1, cores[-1].shape[-1]), saved[:-1]


def merge_batched_backward(
    cores: Sequence[Tensor], saved: Sequence[Tensor], grad: Tensor, direction: Side
) -> list[Tensor]:
    """Gradients ``(G, a, s, b)`` of every stacked core from ``grad`` = dLoss/dP."""
    n, G = len(cores), cores[0].shape[0]
    grads: list[Tensor] = [grad] * n
    if direction == "ltr":
        d_p = grad
        for k in range(n - 1, 0, -1):
            _, a, s, b = cores[k].shape
            d_pk = d_p.reshape(G, -1, s * b)  # (G, rows_{k-1}, s b)
            grads[k] = torch.bmm(saved[k - 1].mT, d_pk).view(cores[k].shape)  # (G, a, s, b)
            d_p = torch.bmm(d_pk, cores[k].reshape(G, a, s * b).mT)  # (G, rows_{k-1}, a)
        grads[0] = d_p.reshape(cores[0].shape)
        return grads
    d_q = grad.reshape(G, cores[0].shape[1], -1)  # (G, a_0, rest)
    for k in range(n - 1):
        _, a, s, b = cores[k].shape
        d_qk = d_q.reshape(G, a * s, -1)  # (G, a s, rest_{k+1})
        q_next = saved[n - 2 - k]  # (G, b, rest_{k+1})
        grads[k] = torch.bmm(d_qk, q_next.mT).view(cores[k].shape)  # (G, a, s, b)
        d_q = torch.bmm(cores[k].reshape(G, a * s, b).mT, d_qk)  # (G, b, rest_{k+1})
    grads[n - 1] = d_q.reshape(cores[n - 1].shape)
    return grads


class GroupSpec(NamedTuple):
    """Static description of a group (hashable): members share every core shape."""

    d: int  # input cores; the other ``len(core_shapes) - d`` are output cores
    in_features: int
    out_features: int
    tau: float
    dirs: tuple[Side, Side]  # merge direction of the input and the output side
    members: int  # G
    rank_to: int = 0  # middle bond zero-padded to this rank (0 or <= r: not padded)


def padded_rank(r: int, rows: int) -> int:
    """The rank to pad a middle bond ``r`` to for products over ``rows`` rows: the next
    multiple of :data:`PAD_MULTIPLE` when that adds at most a quarter and ``rows`` is at least
    :data:`PAD_FROM_ROWS` (where the direct GEMM form runs), else ``r`` (module doc)."""
    up = -(-r // PAD_MULTIPLE) * PAD_MULTIPLE
    if rows < PAD_FROM_ROWS or up == r or 4 * (up - r) > r:
        return r
    return up


def _unstack(t: Tensor) -> tuple[Tensor, ...]:
    return t.unbind(0)


class GroupMergeFunction(torch.autograd.Function):
    """``(L (G, N, r), R (G, r, M))`` of ``G`` gated TT-linears.

    ``params`` lists member 0's cores, then its gates, then member 1's, and so on; all members
    have the same core shapes and threshold. Both outputs are views of padded buffers.
    """

    @staticmethod
    def forward(ctx, spec: GroupSpec, *params: Tensor):
        with torch.autocast(params[0].device.type, enabled=False):  # merges in the cores' dtype
            return GroupMergeFunction._forward(ctx, spec, *params)

    @staticmethod
    def _forward(ctx, spec: GroupSpec, *params: Tensor):
        G = spec.members
        per = len(params) // G
        k = (per + 1) // 2  # cores per member; k - 1 gates
        cores = [torch.stack(params[j::per]) for j in range(k)]  # (G, a, s, b) each
        widths = [params[k + j].shape[0] for j in range(k - 1)]
        gates = [g for i in range(G) for g in params[i * per + k : (i + 1) * per]]
        flat = torch.cat(gates).view(G, -1)  # (G, sum r_k) member by member
        mu_all = torch.nn.functional.threshold(flat, spec.tau, 0.0)  # (G, sum r_k)
        # mu_k scales bond k: applied to the rows of core k + 1 (contiguous (s, b) blocks, a
        # fast broadcast) rather than the last index of core k; the chain is the same
        mus = [m[:, :, None, None] for m in mu_all.split(widths, dim=1)]  # (G, r_k, 1, 1) each
        gated = [cores[0], *torch._foreach_mul(cores[1:], mus)]  # (G, a, s, b) each
        d, r = spec.d, cores[spec.d].shape[1]
        pad = max(0, spec.rank_to - r)
        if pad:  # zero columns on the last input core, zero rows on the first output core
            gated[d - 1] = torch.nn.functional.pad(gated[d - 1], (0, pad))  # (G, a, s, r')
            gated[d] = torch.nn.functional.pad(gated[d], (0, 0, 0, 0, 0, pad))  # (G, r', s, b)
        left, saved_l = merge_batched(gated[:d], spec.dirs[0])  # (G, N', r')
        right, saved_r = merge_batched(gated[d:], spec.dirs[1])  # (G, r' M', 1)
        r = left.shape[-1]
        ctx.pad = pad
        ctx.spec, ctx.widths = spec, widths
        ctx.n_full = (left.shape[1], right.shape[1] // max(r, 1))
        ctx.parts = (cores, flat, mus, gated, saved_l, saved_r)
        out_l = left[:, : spec.in_features]  # (G, N, r)
        out_r = right.view(G, r, -1)[:, :, : spec.out_features]  # (G, r, M)
        return out_l, out_r

    @staticmethod
    def backward(ctx, d_left: Tensor | None, d_right: Tensor | None):
        spec, widths = ctx.spec, ctx.widths
        cores, flat, mus, gated, saved_l, saved_r = ctx.parts
        del ctx.parts
        G, d = spec.members, spec.d
        n_full, m_full = ctx.n_full
        r = gated[d - 1].shape[-1]
        if d_left is None:
            d_left = flat.new_zeros(G, spec.in_features, r)
        if d_right is None:
            d_right = flat.new_zeros(G, r, spec.out_features)
        if n_full != spec.in_features:  # padded input rows get zero gradient
            d_left = torch.cat([d_left, d_left.new_zeros(G, n_full - spec.in_features, r)], 1)
        if m_full != spec.out_features:
            pad = d_right.new_zeros(G, r, m_full - spec.out_features)
            d_right = torch.cat([d_right, pad], dim=2)
        d_gated = merge_batched_backward(gated[:d], saved_l, d_left, spec.dirs[0])
        d_gated += merge_batched_backward(gated[d:], saved_r, d_right, spec.dirs[1])
        if ctx.pad:  # the padded entries are constants: their gradients are dropped
            r0 = r - ctx.pad
            d_gated[d - 1], d_gated[d] = d_gated[d - 1][..., :r0], d_gated[d][:, :r0]
        d_cores = [d_gated[0], *torch._foreach_mul(d_gated[1:], mus)]  # (G, a, s, b) each
        prods = torch._foreach_mul(d_gated[1:], cores[1:])
        d_mu = torch.cat([p.sum(dim=(2, 3)) for p in prods], dim=1)  # (G, sum r_k)
        d_flat = torch.ops.aten.threshold_backward(d_mu, flat, spec.tau)  # (G, sum r_k)
        per_core = [_unstack(c) for c in d_cores]  # k lists of G (a, s, b)
        per_gate = [_unstack(g) for g in d_flat.split(widths, dim=1)]  # k - 1 lists of G (r_k,)
        grads: list[Tensor] = []
        for i in range(G):
            grads += [c[i] for c in per_core]
            grads += [g[i] for g in per_gate]
        return (None, *grads)
