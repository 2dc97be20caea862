"""Optimized TTM embedding lookup: both levels of reuse, with a hand-written backward.

Cores ``G_k`` have shape ``(r_{k-1}, n_k, m_k, r_k)`` and the first ``K - 1`` are gated on their
last index by ``mu(g_k) = g_k * 1[g_k > tau]`` (docs/method.md#ttm-embedding-format,
docs/method.md#rank-gates). Row ``t`` of the table is row-major over ``(n_1..n_K)`` and its
columns are row-major over ``(m_1..m_K)``.

The lookup (docs/method.md#ttm-lookup) splits the chain at bond ``h``:

* **tensor-index level**: the gated left half is merged once per call into
  ``A (N_L, M_L, r_h)`` and the right half into ``Bm (N_R, r_h, M_R)``, independently of the
  batch (:func:`engine.tt.chain.merge`, then one permute each);
* **row-index level**: ids are deduplicated, ``t = p * N_R + q``, and each unique row is one
  small GEMM ``A[p] @ Bm[q]`` of shape ``(M_L, r_h) @ (r_h, M_R)``;

and the backward accumulates the output gradient per unique row before the two GEMMs, scatters
it into ``dA`` and ``dBm`` and runs :func:`engine.tt.chain.merge_backward` to the cores and gates.

``kernel`` (:class:`engine.kernels.KernelPref`, default AUTO) picks the torch ops or the Triton
kernels (:mod:`engine.kernels.ttm_rows` gathers by sub-index inside the kernel, so the gathered
``(U, M_L, r)`` / ``(U, r, M_R)`` copies are neither built nor saved; the merges run on
:mod:`engine.kernels.merge`). AUTO on CPU tensors runs exactly the torch ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from engine.kernels.backend import KernelPref, resolve_backend
from engine.kernels.merge import merge_chain, merge_chain_backward
from engine.kernels.ttm_rows import ttm_rows, ttm_rows_backward
from engine.tt.chain import merge, merge_backward, merge_macs
from engine.tt.cores import gate_mu

__all__ = ["LookupPlan", "choose_split", "make_plan", "ttm_lookup", "TTMLookupFunction"]


def choose_split(core_shapes: Sequence[tuple[int, int, int, int]]) -> int:
    """Bond ``h`` (1..K-1) minimizing the merge cost of ``[1, h)`` ltr plus ``[h, K)`` rtl.

    The per-row cost ``M_L * r_h * M_R = D * r_h`` barely depends on ``h``; the merges do.
    Ties go to the split closest to ``K // 2``.
    """
    k = len(core_shapes)
    flat = [(a, n * m, b) for a, n, m, b in core_shapes]

    def cost(h: int) -> tuple[int, int]:
        macs = merge_macs(flat[:h], "ltr") + merge_macs(flat[h:], "rtl")
        return macs, abs(h - k // 2)

    return min(range(1, k), key=cost)


@dataclass(frozen=True)
class LookupPlan:
    """Static layout of one lookup: split bond, mode groups and the two permutations."""

    h: int
    n_right: int  # N_R = prod(n_{h+1}..n_K)
    left_view: tuple[int, ...]  # (n_1, m_1, .., n_h, m_h, r_h)
    left_perm: tuple[int, ...]  # -> (n_1..n_h, m_1..m_h, r_h)
    left_shape: tuple[int, int, int]  # (N_L, M_L, r_h)
    right_view: tuple[int, ...]  # (r_h, n_{h+1}, m_{h+1}, .., n_K, m_K)
    right_perm: tuple[int, ...]  # -> (n_{h+1}..n_K, r_h, m_{h+1}..m_K)
    right_shape: tuple[int, int, int]  # (N_R, r_h, M_R)
    dim: int  # D = M_L * M_R


def make_plan(core_shapes: Sequence[tuple[int, int, int, int]], h: int | None = None) -> LookupPlan:
    """Plan for cores of the given shapes; ``h`` defaults to :func:`choose_split`."""
    k = len(core_shapes)
    if k < 2:
        raise ValueError(f"a TTM lookup needs at least 2 cores, got {k}")
    h = choose_split(core_shapes) if h is None else h
    if not 1 <= h < k:
        raise ValueError(f"split h must be in [1, {k - 1}], got {h}")
    ns = [s[1] for s in core_shapes]
    ms = [s[2] for s in core_shapes]
    r = core_shapes[h - 1][3]
    left_view = (*(x for i in range(h) for x in (ns[i], ms[i])), r)
    left_perm = (*range(0, 2 * h, 2), *range(1, 2 * h, 2), 2 * h)
    right_view = (r, *(x for i in range(h, k) for x in (ns[i], ms[i])))
    n_r = k - h
    right_perm = (*range(1, 2 * n_r, 2), 0, *range(2, 2 * n_r + 1, 2))
    m_l, m_r = math.prod(ms[:h]), math.prod(ms[h:])
    return LookupPlan(
        h=h,
        n_right=math.prod(ns[h:]),
        left_view=left_view,
        left_perm=left_perm,
        left_shape=(math.prod(ns[:h]), m_l, r),
        right_view=right_view,
        right_perm=right_perm,
        right_shape=(math.prod(ns[h:]), r, m_r),
        dim=m_l * m_r,
    )


def _inverse(perm: Sequence[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


class TTMLookupFunction(torch.autograd.Function):
    """``out[t] = row ids[t]`` of the gated TTM table for flat ``ids``; see the module doc."""

    @staticmethod
    def forward(
        ctx, ids: Tensor, plan: LookupPlan, tau: float, dedup: bool, backend: str, *params: Tensor
    ):
        k = (len(params) + 1) // 2
        cores, gates = params[:k], params[k:]
        mus = [gate_mu(g, tau) for g in gates]  # each (r_k,)
        gated = [c * mu for c, mu in zip(cores[:-1], mus, strict=True)]  # (r, n, m, r_k)
        gated.append(cores[-1])
        flat = [g.reshape(g.shape[0], -1, g.shape[3]) for g in gated]  # each (a, n m, b)
        h = plan.h
        if backend == "triton":
            left, saved_l = merge_chain(flat[:h], "ltr", backend)  # (n_1 m_1 .. n_h m_h, r_h)
            right, saved_r = merge_chain(flat[h:], "rtl", backend)  # (r_h n_{h+1} .. m_K, 1)
        else:
            left, saved_l = merge(flat[:h], "ltr")  # (n_1 m_1 .. n_h m_h, r_h)
            right, saved_r = merge(flat[h:], "rtl")  # (r_h n_{h+1} m_{h+1} .. m_K, 1)
        a = left.view(plan.left_view).permute(plan.left_perm)  # (n_1..n_h, m_1..m_h, r_h)
        a = a.reshape(plan.left_shape)  # (N_L, M_L, r_h)
        bm = right.view(plan.right_view).permute(plan.right_perm)  # (n.., r_h, m..)
        bm = bm.reshape(plan.right_shape)  # (N_R, r_h, M_R)
        if dedup:
            u, inv = torch.unique(ids, return_inverse=True)  # (U,), (T,)
        else:
            u, inv = ids, None  # (T,)
        p = torch.div(u, plan.n_right, rounding_mode="floor")  # (U,)
        q = u - p * plan.n_right  # (U,)
        if backend == "triton":
            a_p, b_q = a, bm  # (N_L, M_L, r_h), (N_R, r_h, M_R): gathered inside the kernel
            rows = ttm_rows(a, bm, p, q, True)  # (U, D)
        else:
            a_p = a.index_select(0, p)  # (U, M_L, r_h)
            b_q = bm.index_select(0, q)  # (U, r_h, M_R)
            rows = torch.bmm(a_p, b_q).view(-1, plan.dim)  # (U, D)
        out = rows if inv is None else rows.index_select(0, inv)  # (T, D)
        ctx.plan, ctx.tau, ctx.k, ctx.backend = plan, tau, k, backend
        ctx.n_unique = u.shape[0]
        ctx.save_for_backward(p, q, inv, a_p, b_q, *cores, *gates, *mus, *gated, *saved_l, *saved_r)
        ctx.n_saved = (len(saved_l), len(saved_r))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        plan, tau, k = ctx.plan, ctx.tau, ctx.k
        p, q, inv, a_p, b_q, *rest = ctx.saved_tensors
        cores, rest = rest[:k], rest[k:]
        gates, rest = rest[: k - 1], rest[k - 1 :]
        mus, rest = rest[: k - 1], rest[k - 1 :]
        gated, rest = rest[:k], rest[k:]
        n_l = ctx.n_saved[0]
        saved_l, saved_r = rest[:n_l], rest[n_l:]
        if inv is None:
            d_rows = d_out  # (U = T, D)
        else:
            d_rows = d_out.new_zeros(ctx.n_unique, plan.dim)  # (U, D)
            d_rows.index_add_(0, inv, d_out)  # (U, D): gradient accumulated per unique row
        if ctx.backend == "triton":  # a_p, b_q are the whole halves A, Bm here
            # (N_L, M_L, r_h), (N_R, r_h, M_R)
            d_a, d_b = ttm_rows_backward(d_rows, a_p, b_q, p, q, True)
            del d_rows
        else:
            d_rows = d_rows.reshape(-1, plan.left_shape[1], plan.right_shape[2])  # (U, M_L, M_R)
            d_ap = torch.bmm(d_rows, b_q.mT)  # (U, M_L, r_h)
            d_a = d_ap.new_zeros(plan.left_shape).index_add_(0, p, d_ap)  # (N_L, M_L, r_h)
            del d_ap
            d_bq = torch.bmm(a_p.mT, d_rows)  # (U, r_h, M_R)
            del d_rows
            d_b = d_bq.new_zeros(plan.right_shape).index_add_(0, q, d_bq)  # (N_R, r_h, M_R)
            del d_bq
        left_perm_shape = [plan.left_view[i] for i in plan.left_perm]
        d_left = d_a.view(left_perm_shape).permute(_inverse(plan.left_perm))  # (n_1, m_1, .., r_h)
        right_perm_shape = [plan.right_view[i] for i in plan.right_perm]
        d_right = d_b.view(right_perm_shape).permute(_inverse(plan.right_perm))  # (r_h, n, m, ..)
        h = plan.h
        flat = [g.reshape(g.shape[0], -1, g.shape[3]) for g in gated]  # each (a, n m, b)
        if ctx.backend == "triton":
            d_gated = [
                *merge_chain_backward(flat[:h], saved_l, d_left, "ltr", "triton"),  # (a, n m, b)
                *merge_chain_backward(flat[h:], saved_r, d_right, "rtl", "triton"),
            ]
        else:
            d_gated = [
                *merge_backward(flat[:h], saved_l, d_left, "ltr"),  # each (a, n m, b)
                *merge_backward(flat[h:], saved_r, d_right, "rtl"),  # each (a, n m, b)
            ]
        d_cores: list[Tensor | None] = []
        d_gates: list[Tensor | None] = []
        for i in range(k - 1):
            b = cores[i].shape[3]
            d_gt = d_gated[i].reshape(-1, b)  # (a n m, b)
            d_cores.append((d_gt * mus[i]).view(cores[i].shape))  # (a, n, m, b)
            d_mu = (d_gt * cores[i].reshape(-1, b)).sum(0)  # (b,)
            d_gates.append(torch.ops.aten.threshold_backward(d_mu, gates[i], tau))  # (b,)
        d_cores.append(d_gated[k - 1].view(cores[k - 1].shape))  # (a, n, m, 1)
        needs = ctx.needs_input_grad[5:]
        grads = [g if need else None for g, need in zip(d_cores + d_gates, needs, strict=True)]
        return (None, None, None, None, None, *grads)


def ttm_lookup(
    ids: Tensor,
    cores: Sequence[Tensor],
    gates: Sequence[Tensor],
    tau: float,
    *,
    dedup: bool = True,
    plan: LookupPlan | None = None,
    kernel: KernelPref | str = KernelPref.AUTO,
) -> Tensor:
    """Rows ``ids`` (any integer shape ``(...)``) of the gated TTM table: ``(..., D)``.

    Ids are not range-checked here (the module does it); rows past the vocabulary are padding.
    ``kernel`` chooses torch or Triton (:func:`engine.kernels.resolve_backend`).
    """
    if plan is None:
        plan = make_plan([tuple(c.shape) for c in cores])
    backend = resolve_backend(kernel, *cores, *gates)
    flat_ids = ids.reshape(-1)  # (T,)
    with torch.autocast(ids.device.type, enabled=False):  # rows in the cores' dtype (no AMP)
        out = TTMLookupFunction.apply(flat_ids, plan, tau, dedup, backend, *cores, *gates)  # (T, D)
    return out.view(*ids.shape, plan.dim)  # (..., D)
