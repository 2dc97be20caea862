"""One strided, batched, gathered GEMM kernel: every small TT contraction is an instance.

For ``u`` in ``range(U)`` the kernel computes::

    C[ic[u]] (+)= f(A[ia[u]]) @ B[ib[u]]     then, optionally, * gelu'(P[u]) elementwise

with ``A (., M, K)``, ``B (., K, N)``, ``C (., M, N)`` given as arbitrary strided 3-D views
(transposes are free: ``X^T`` is ``X`` with two strides swapped), ``ia``, ``ib``, ``ic``
optional batch indices (identity when absent), ``f`` the identity or GELU (erf form, as
``F.gelu``), a trailing column of ones in ``C`` (``[x L, 1]``: the bias rides along as an extra
rank), and ``(+)=`` an atomic add into a float32 buffer when the output is scattered (``ic``)
or the reduction is split over programs (``split_k``). Instances:

* TTM lookup rows ``out[u] = A[p_u] @ Bm[q_u]`` and its scatter-add backward
  (:mod:`engine.kernels.ttm_rows`);
* the merge of two adjacent cores and its backward (:mod:`engine.kernels.merge`);
* the fused skinny products of the TT-linear (:mod:`engine.kernels.skinny`).

Layout follows Triton's matmul tutorial (``python/tutorials/03-matrix-multiplication.py``):
one program per (batch entry, output tile, reduction split); float32 accumulation.

Compiled and interpreted: ``@triton.jit`` picks one by ``TRITON_INTERPRET`` when the decorator
runs, and triton's own ``@jit`` language functions (``tl.zeros``, ...) are fixed when
``triton`` is imported, so a process that imported triton first (``torch._dynamo``,
``torch.utils.flop_counter`` do) could never interpret. Instead the kernel is a plain function
that uses only builtins (``tl.full``, not ``tl.zeros``; GELU written out), wrapped explicitly as
a ``JITFunction`` for CUDA tensors and an ``InterpretedFunction`` for CPU tensors (or for any
tensors while ``TRITON_INTERPRET=1``), whatever the import order. Under the interpreter
``tl.dot`` of bfloat16 operands is wrong in triton 3.9 (it multiplies the bfloat16 bit
patterns as integers), so operands are upcast to float32 first: bf16 x bf16 products are exact
in float32, so this is what a GPU's bf16 MMA with float32 accumulation gives, up to the
summation order.

This module imports triton: it is imported lazily, on the first Triton launch.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from engine.kernels.backend import interpreter_requested
from engine.kernels.config import GemmConfig, gemm_config

__all__ = ["gemm", "kernel_for", "matmul"]


def _gemm_kernel(
    c_ptr,
    a_ptr,
    b_ptr,
    ia_ptr,
    ib_ptr,
    ic_ptr,
    p_ptr,
    M,
    N,
    K,
    GRID_N,
    K_PER_SPLIT,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_pb,
    stride_pm,
    stride_pn,
    GATHER_A: tl.constexpr,
    GATHER_B: tl.constexpr,
    INDEX_C: tl.constexpr,
    ATOMIC_C: tl.constexpr,
    GELU_A: tl.constexpr,
    GELU_GRAD: tl.constexpr,
    ONES_COL: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``C[ic[u]] (+)= f(A[ia[u]]) @ B[ib[u]] (* gelu'(P[u]))`` for one output tile of one batch
    entry over one reduction split (module doc); grid ``(U, tiles_m * tiles_n, split_k)``."""
    pid_u = tl.program_id(0)  # batch entry: axis 0 has no 65535 limit
    pid_mn = tl.program_id(1)
    pid_k = tl.program_id(2)
    pid_m = pid_mn // GRID_N
    pid_n = pid_mn % GRID_N
    if GATHER_A:
        ua = tl.load(ia_ptr + pid_u).to(tl.int64)
    else:
        ua = pid_u.to(tl.int64)
    if GATHER_B:
        ub = tl.load(ib_ptr + pid_u).to(tl.int64)
    else:
        ub = pid_u.to(tl.int64)
    if INDEX_C:
        uc = tl.load(ic_ptr + pid_u).to(tl.int64)
    else:
        uc = pid_u.to(tl.int64)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
    rk = tl.arange(0, BLOCK_K)  # (BK,)
    a_base = a_ptr + ua * stride_ab
    b_base = b_ptr + ub * stride_bb
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # (BM, BN)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + rk  # (BK,)
        a_mask = (rm[:, None] < M) & (ks[None, :] < k_hi)
        a = tl.load(
            a_base + rm[:, None] * stride_am + ks[None, :] * stride_ak, mask=a_mask, other=0.0
        )  # (BM, BK)
        b_mask = (ks[:, None] < k_hi) & (rn[None, :] < N)
        b = tl.load(
            b_base + ks[:, None] * stride_bk + rn[None, :] * stride_bn, mask=b_mask, other=0.0
        )  # (BK, BN)
        if GELU_A:  # x Phi(x), erf form; gelu(0) = 0 keeps masked entries zero; rounded
            a32 = a.to(tl.float32)  # to the input dtype as F.gelu's output is
            a = (0.5 * a32 * (1.0 + tl.math.erf(a32 * 0.7071067811865476))).to(a.dtype)
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)  # (BM, BN) float32

    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if GELU_GRAD:  # linear in acc, so also right per reduction split
        pre = tl.load(
            p_ptr
            + pid_u.to(tl.int64) * stride_pb
            + rm[:, None] * stride_pm
            + rn[None, :] * stride_pn,
            mask=c_mask,
            other=0.0,
        )  # (BM, BN)
        x = pre.to(tl.float32)  # gelu'(x) = Phi(x) + x phi(x)
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        acc = acc * (cdf + x * tl.exp(-0.5 * x * x) * 0.3989422804014327)
    c_base = c_ptr + uc * stride_cb
    c_ptrs = c_base + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    if ATOMIC_C:
        tl.atomic_add(c_ptrs, acc, mask=c_mask)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    if ONES_COL:  # the column N of C is 1: written once per row tile, never accumulated
        if (pid_n == 0) & (pid_k == 0):
            ones = tl.full((BLOCK_M,), 1.0, dtype=tl.float32).to(c_ptr.dtype.element_ty)
            tl.store(c_base + rm * stride_cm + N * stride_cn, ones, mask=rm < M)


@functools.cache
def kernel_for(interpreted: bool) -> JITFunction | InterpretedFunction:
    """The kernel compiled for the GPU, or run by Triton's interpreter (module doc)."""
    return InterpretedFunction(_gemm_kernel) if interpreted else JITFunction(_gemm_kernel)


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _batch(index: Tensor | None, size: int) -> int:
    return index.shape[0] if index is not None else size


def gemm(
    out: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    ia: Tensor | None = None,
    ib: Tensor | None = None,
    ic: Tensor | None = None,
    pre: Tensor | None = None,
    gelu_a: bool = False,
    ones: bool = False,
    accumulate: bool = False,
    config: GemmConfig | None = None,
) -> None:
    """Launch the kernel (module doc) on 3-D views; ``out`` is written, or accumulated
    (float32, atomic) when ``accumulate`` (required with ``ic`` or ``split_k > 1``)."""
    (_, m, k), (_, k2, n) = a.shape, b.shape
    u = _batch(ia, a.shape[0])
    if k != k2 or out.shape[1] != m or out.shape[2] != n + int(ones):
        raise ValueError(
            f"gemm shapes do not match: a {tuple(a.shape)} b {tuple(b.shape)} "
            f"out {tuple(out.shape)} ones={ones}"
        )
    if u != _batch(ib, b.shape[0]) or (ic is None and u != out.shape[0]):
        raise ValueError(f"gemm batch sizes do not match: {u}, b {b.shape[0]}, out {out.shape[0]}")
    if ic is not None and ic.shape[0] != u:
        raise ValueError(f"ic has {ic.shape[0]} entries for a batch of {u}")
    if a.dtype != b.dtype:
        raise TypeError(f"gemm operands must share a dtype, got {a.dtype} and {b.dtype}")
    if (ic is not None and not accumulate) or (accumulate and out.dtype != torch.float32):
        raise ValueError("a scattered output (ic) is accumulated into a float32 buffer")
    if pre is not None and tuple(pre.shape) != (u, m, n):
        raise ValueError(f"pre must have shape {(u, m, n)}, got {tuple(pre.shape)}")
    for t in (out, a, b, pre):
        if t is not None and t.numel() >= 2**31:  # in-tile offsets are int32
            raise ValueError(f"operand of {t.numel()} entries exceeds the kernel's 2^31 limit")
    if u == 0 or m == 0 or n + int(ones) == 0:
        return
    cfg = config or gemm_config(u, m, n, k, allow_split=accumulate)
    if cfg.split_k > 1 and not accumulate:
        raise ValueError("split_k > 1 needs accumulate=True (a zeroed float32 output)")
    k_per_split = max(1, _cdiv(_cdiv(k, cfg.split_k), cfg.block_k)) * cfg.block_k
    split = max(1, _cdiv(k, k_per_split))
    grid_n = _cdiv(n, cfg.block_n)
    grid = (u, _cdiv(m, cfg.block_m) * grid_n, split)
    fp32 = a.dtype == torch.float32
    precision = ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee") if fp32 else None
    p = pre if pre is not None else out
    interpreted = out.device.type == "cpu" or interpreter_requested()
    kernel_for(interpreted)[grid](
        out,
        a,
        b,
        ia if ia is not None else a,
        ib if ib is not None else b,
        ic if ic is not None else out,
        p,
        m,
        n,
        k,
        grid_n,
        k_per_split,
        *a.stride(),
        *b.stride(),
        *out.stride(),
        *p.stride(),
        GATHER_A=ia is not None,
        GATHER_B=ib is not None,
        INDEX_C=ic is not None,
        ATOMIC_C=accumulate,
        GELU_A=gelu_a,
        GELU_GRAD=pre is not None,
        ONES_COL=ones,
        DOT_F32=interpreted or fp32,
        PRECISION=precision,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def matmul(
    a: Tensor,
    b: Tensor,
    *,
    ia: Tensor | None = None,
    ib: Tensor | None = None,
    pre: Tensor | None = None,
    gelu_a: bool = False,
    ones: bool = False,
    config: GemmConfig | None = None,
) -> Tensor:
    """A new ``(U, M, N [+ 1])`` tensor in ``a``'s dtype (see :func:`gemm`); a split reduction
    goes through a float32 buffer."""
    (_, m, k), n = a.shape, b.shape[2]
    u = _batch(ia, a.shape[0])
    cfg = config or gemm_config(u, m, n, k, allow_split=True)
    shape = (u, m, n + int(ones))
    if cfg.split_k == 1:
        out = a.new_empty(shape)  # (U, M, N [+ 1])
        gemm(out, a, b, ia=ia, ib=ib, pre=pre, gelu_a=gelu_a, ones=ones, config=cfg)
        return out
    out = a.new_zeros(shape, dtype=torch.float32)  # (U, M, N [+ 1])
    gemm(out, a, b, ia=ia, ib=ib, pre=pre, gelu_a=gelu_a, ones=ones, accumulate=True, config=cfg)
    return out.to(a.dtype)
