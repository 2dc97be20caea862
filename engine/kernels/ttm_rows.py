"""The per-row contraction of the TTM embedding lookup, as ``torch.library`` custom ops.

With the pre-merged halves ``A (N_L, M_L, r)`` and ``Bm (N_R, r, M_R)`` and the sub-indices
``(p, q)`` of the unique rows (see :mod:`engine.nn.ttm_functional`)::

    out[u]  = A[p_u] @ Bm[q_u]                        (U, M_L * M_R)
    dA[i]   = sum_{u: p_u = i} dOut[u] @ Bm[q_u]^T     (N_L, M_L, r)
    dBm[j]  = sum_{u: q_u = j} A[p_u]^T @ dOut[u]      (N_R, r, M_R)

``dOut`` is already accumulated per unique row (the caller's ``index_add`` over the inverse
of the dedup). The Triton forward gathers ``A[p_u]``, ``Bm[q_u]`` by sub-index inside the
kernel (no ``(U, M_L, r)`` / ``(U, r, M_R)`` copies, so none are saved for backward either);
the backward recomputes the same gathers and scatter-adds with float32 atomics (order of the
additions, hence the last bits, not deterministic). Indices are not range-checked here: that
needs a device sync; :class:`engine.nn.ttm_embedding.TTMEmbedding` checks the ids.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels.backend import ensure_triton

__all__ = ["ttm_rows", "ttm_rows_backward", "ttm_rows_reference", "ttm_rows_backward_reference"]


def _check(a: Tensor, bm: Tensor, p: Tensor, q: Tensor) -> None:
    torch._check(a.dim() == 3 and bm.dim() == 3, lambda: "A and Bm must be 3-D")
    torch._check(
        a.shape[2] == bm.shape[1],
        lambda: f"rank mismatch: A {tuple(a.shape)}, Bm {tuple(bm.shape)}",
    )
    torch._check(
        p.dim() == 1 and q.dim() == 1 and p.shape[0] == q.shape[0],
        lambda: f"p and q must be 1-D of one length, got {tuple(p.shape)}, {tuple(q.shape)}",
    )
    torch._check(
        not p.is_floating_point() and not q.is_floating_point(),
        lambda: "p and q must be integer tensors",
    )
    torch._check(a.dtype == bm.dtype, lambda: f"A and Bm dtypes differ: {a.dtype}, {bm.dtype}")


def ttm_rows_reference(a: Tensor, bm: Tensor, p: Tensor, q: Tensor) -> Tensor:
    """Plain torch: gather both halves, one batched GEMM (as ``TTMLookupFunction``)."""
    a_p = a.index_select(0, p)  # (U, M_L, r)
    b_q = bm.index_select(0, q)  # (U, r, M_R)
    return torch.bmm(a_p, b_q).view(p.shape[0], a.shape[1] * bm.shape[2])  # (U, M_L M_R)


def ttm_rows_backward_reference(
    d_rows: Tensor, a: Tensor, bm: Tensor, p: Tensor, q: Tensor
) -> tuple[Tensor, Tensor]:
    """Plain torch: the two GEMMs per unique row, then ``index_add`` into dA and dBm."""
    d3 = d_rows.reshape(p.shape[0], a.shape[1], bm.shape[2])  # (U, M_L, M_R)
    d_ap = torch.bmm(d3, bm.index_select(0, q).mT)  # (U, M_L, r)
    d_a = torch.zeros_like(a).index_add_(0, p, d_ap)  # (N_L, M_L, r)
    d_bq = torch.bmm(a.index_select(0, p).mT, d3)  # (U, r, M_R)
    d_b = torch.zeros_like(bm).index_add_(0, q, d_bq)  # (N_R, r, M_R)
    return d_a, d_b


@torch.library.custom_op("comera::ttm_rows", mutates_args=())
def ttm_rows(a: Tensor, bm: Tensor, p: Tensor, q: Tensor, use_triton: bool) -> Tensor:
    """``out[u] = A[p_u] @ Bm[q_u]`` flattened: (U, M_L * M_R)."""
    _check(a, bm, p, q)
    if not use_triton:
        return ttm_rows_reference(a, bm, p, q)
    ensure_triton([a, bm], "comera::ttm_rows (Triton)")
    from engine.kernels.triton_gemm import matmul

    return matmul(a, bm, ia=p, ib=q).view(p.shape[0], a.shape[1] * bm.shape[2])  # (U, D)


@ttm_rows.register_fake
def _(a, bm, p, q, use_triton):
    _check(a, bm, p, q)
    return a.new_empty(p.shape[0], a.shape[1] * bm.shape[2])


@torch.library.custom_op("comera::ttm_rows_backward", mutates_args=())
def ttm_rows_backward(
    d_rows: Tensor, a: Tensor, bm: Tensor, p: Tensor, q: Tensor, use_triton: bool
) -> tuple[Tensor, Tensor]:
    """``(dA, dBm)`` for the per-unique-row gradient ``d_rows`` (U, M_L * M_R)."""
    _check(a, bm, p, q)
    m_l, m_r = a.shape[1], bm.shape[2]
    torch._check(
        tuple(d_rows.shape) == (p.shape[0], m_l * m_r),
        lambda: f"d_rows must be {(p.shape[0], m_l * m_r)}, got {tuple(d_rows.shape)}",
    )
    if not use_triton:
        return ttm_rows_backward_reference(d_rows, a, bm, p, q)
    ensure_triton([d_rows, a, bm], "comera::ttm_rows_backward (Triton)")
    from engine.kernels.triton_gemm import gemm

    d3 = d_rows.reshape(p.shape[0], m_l, m_r)  # (U, M_L, M_R)
    d_a = torch.zeros(a.shape, dtype=torch.float32, device=a.device)  # (N_L, M_L, r)
    gemm(d_a, d3, bm.mT, ib=q, ic=p, accumulate=True)  # dA[p_u] += dOut_u Bm[q_u]^T
    d_b = torch.zeros(bm.shape, dtype=torch.float32, device=bm.device)  # (N_R, r, M_R)
    gemm(d_b, a.mT, d3, ia=p, ic=q, accumulate=True)  # dBm[q_u] += A[p_u]^T dOut_u
    return d_a.to(a.dtype), d_b.to(bm.dtype)


@ttm_rows_backward.register_fake
def _(d_rows, a, bm, p, q, use_triton):
    _check(a, bm, p, q)
    return torch.empty_like(a), torch.empty_like(bm)


def _setup_context(ctx, inputs, output) -> None:
    a, bm, p, q, use_triton = inputs
    ctx.save_for_backward(a, bm, p, q)
    ctx.use_triton = use_triton


def _backward(ctx, d_out: Tensor):
    a, bm, p, q = ctx.saved_tensors
    d_a, d_b = ttm_rows_backward(d_out.contiguous(), a, bm, p, q, ctx.use_triton)
    return d_a, d_b, None, None, None


ttm_rows.register_autograd(_backward, setup_context=_setup_context)
