"""Merging two adjacent TT cores over a batch of chains, as ``torch.library`` custom ops,
and the chain merges of :mod:`engine.tt.chain` built on them.

For a batch of ``G`` chains, cores ``X (G, a, n, r)`` and ``Y (G, r, m, b)`` merge into::

    Z[g, c, (i, j), e] = sum_k X[g, c, i, k] Y[g, k, j, e]        Z (G, a, n * m, b)

which is one small GEMM per chain, ``(a n, r) @ (r, m b)``, with ``r`` a TT rank: a reduction
too short for cuBLAS to fill the GPU. Backward::

    dX[g] = dZ[g] @ Y[g]^T   (a n, m b) @ (m b, r)
    dY[g] = X[g]^T @ dZ[g]   (r, a n) @ (a n, m b)    a long reduction: split over programs

Every step of :func:`engine.tt.chain.merge` is such a merge (``ltr``: the prefix ``P (rows, a)``
is the core ``(1, rows, a)``; ``rtl``: the suffix ``S (b, rest)`` is the core ``(b, rest, 1)``),
and every step of its backward is the merge backward, so :func:`merge_chain` and
:func:`merge_chain_backward` return exactly what the torch versions return (same saved
intermediates), with the torch backend delegating to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from engine.kernels.backend import Backend, ensure_triton
from engine.tt.chain import Direction, merge, merge_backward

__all__ = [
    "merge_chain",
    "merge_chain_backward",
    "merge_pair",
    "merge_pair_backward",
    "merge_pair_reference",
]


def _check(x: Tensor, y: Tensor) -> None:
    torch._check(
        x.dim() == 4 and y.dim() == 4,
        lambda: f"cores must be (G, a, n, r) and (G, r, m, b), got {x.shape}, {y.shape}",
    )
    torch._check(
        x.shape[0] == y.shape[0] and x.shape[3] == y.shape[1],
        lambda: f"cannot merge {tuple(x.shape)} with {tuple(y.shape)}",
    )
    torch._check(x.dtype == y.dtype, lambda: f"dtypes differ: {x.dtype}, {y.dtype}")


def _out_shape(x: Tensor, y: Tensor) -> tuple[int, int, int, int]:
    return (x.shape[0], x.shape[1], x.shape[2] * y.shape[2], y.shape[3])


def merge_pair_reference(x: Tensor, y: Tensor) -> Tensor:
    """Plain torch: one ``bmm`` (G, a n, r) @ (G, r, m b)."""
    g, a, n, r = x.shape
    z = torch.bmm(x.reshape(g, a * n, r), y.reshape(g, r, -1))  # (G, a n, m b)
    return z.view(_out_shape(x, y))  # (G, a, n m, b)


@torch.library.custom_op("comera::merge_pair", mutates_args=())
def merge_pair(x: Tensor, y: Tensor, use_triton: bool) -> Tensor:
    """``Z (G, a, n m, b)`` from ``X (G, a, n, r)`` and ``Y (G, r, m, b)``."""
    _check(x, y)
    if not use_triton:
        return merge_pair_reference(x, y)
    ensure_triton([x, y], "comera::merge_pair (Triton)")
    from engine.kernels.triton_gemm import matmul

    g, a, n, r = x.shape
    z = matmul(x.reshape(g, a * n, r), y.reshape(g, r, -1))  # (G, a n, m b)
    return z.view(_out_shape(x, y))


@merge_pair.register_fake
def _(x, y, use_triton):
    _check(x, y)
    return x.new_empty(_out_shape(x, y))


@torch.library.custom_op("comera::merge_pair_backward", mutates_args=())
def merge_pair_backward(
    dz: Tensor, x: Tensor, y: Tensor, use_triton: bool
) -> tuple[Tensor, Tensor]:
    """``(dX, dY)`` for ``dZ (G, a, n m, b)``."""
    _check(x, y)
    torch._check(
        tuple(dz.shape) == _out_shape(x, y),
        lambda: f"dZ must be {_out_shape(x, y)}, got {tuple(dz.shape)}",
    )
    g, a, n, r = x.shape
    x3 = x.reshape(g, a * n, r)  # (G, a n, r)
    y3 = y.reshape(g, r, -1)  # (G, r, m b)
    dz3 = dz.reshape(g, a * n, -1)  # (G, a n, m b)
    if not use_triton:
        dx = torch.bmm(dz3, y3.mT)  # (G, a n, r)
        dy = torch.bmm(x3.mT, dz3)  # (G, r, m b)
    else:
        ensure_triton([dz, x, y], "comera::merge_pair_backward (Triton)")
        from engine.kernels.triton_gemm import matmul

        dx = matmul(dz3, y3.mT)  # (G, a n, r)
        dy = matmul(x3.mT, dz3)  # (G, r, m b): reduction over a n, split when long
    return dx.view(x.shape), dy.view(y.shape)


@merge_pair_backward.register_fake
def _(dz, x, y, use_triton):
    _check(x, y)
    return torch.empty_like(x), torch.empty_like(y)


def _setup_context(ctx, inputs, output) -> None:
    x, y, use_triton = inputs
    ctx.save_for_backward(x, y)
    ctx.use_triton = use_triton


def _backward(ctx, dz: Tensor):
    x, y = ctx.saved_tensors
    dx, dy = merge_pair_backward(dz.contiguous(), x, y, ctx.use_triton)
    return dx, dy, None


merge_pair.register_autograd(_backward, setup_context=_setup_context)


def _pair_prefix_step(p: Tensor, g: Tensor) -> Tensor:
    """:func:`engine.tt.chain.merge`'s ``ltr`` step as a :func:`merge_pair`: the prefix
    ``(rows, a)`` is the core ``(1, rows, a)``."""
    a, s, b = g.shape
    z = merge_pair(p.reshape(1, 1, -1, a), g.reshape(1, a, s, b), True)  # (1, 1, ., b)
    return z.view(-1, b)  # (a_0 s_1..s_k, a_k)


def _pair_suffix_step(g: Tensor, q: Tensor) -> Tensor:
    """The ``rtl`` step: the suffix ``(b, rest)`` is the core ``(b, rest, 1)``."""
    a, s, b = g.shape
    z = merge_pair(g.reshape(1, a, s, b), q.reshape(1, b, -1, 1), True)  # (1, a, ., 1)
    return z.view(a, -1)  # (a_{k-1}, s_k..s_K a_K)


def _pair_prefix_grads(d_p: Tensor, prev: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of :func:`_pair_prefix_step`: ``(dL/dg, dL/dprev)``."""
    a, s, b = g.shape
    dz = d_p.reshape(1, 1, -1, b)  # (1, 1, rows_{k-1} s_k, a_k)
    dx, dy = merge_pair_backward(dz, prev.reshape(1, 1, -1, a), g.reshape(1, a, s, b), True)
    return dy.view(a, s, b), dx.view(-1, a)  # (a_{k-1}, s_k, a_k), (rows_{k-1}, a_{k-1})


def _pair_suffix_grads(d_q: Tensor, g: Tensor, q_next: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of :func:`_pair_suffix_step`: ``(dL/dg, dL/dq_next)``."""
    a, s, b = g.shape
    dz = d_q.reshape(1, a, -1, 1)  # (1, a_{k-1}, s_k rest_{k+1}, 1)
    dx, dy = merge_pair_backward(dz, g.reshape(1, a, s, b), q_next.reshape(1, b, -1, 1), True)
    return dx.view(a, s, b), dy.view(b, -1)  # (a_{k-1}, s_k, a_k), (a_k, rest_{k+1})


def merge_chain(
    cores: Sequence[Tensor], direction: Direction, backend: Backend
) -> tuple[Tensor, list[Tensor]]:
    """:func:`engine.tt.chain.merge` with each step a :func:`merge_pair` (Triton backend)."""
    if backend == "torch":
        return merge(cores, direction)
    return merge(cores, direction, prefix_step=_pair_prefix_step, suffix_step=_pair_suffix_step)


def merge_chain_backward(
    cores: Sequence[Tensor],
    saved: Sequence[Tensor],
    grad: Tensor,
    direction: Direction,
    backend: Backend,
) -> list[Tensor]:
    """:func:`engine.tt.chain.merge_backward` with each step a :func:`merge_pair_backward`."""
    if backend == "torch":
        return merge_backward(cores, saved, grad, direction)
    return merge_backward(
        cores,
        saved,
        grad,
        direction,
        prefix_grads=_pair_prefix_grads,
        suffix_grads=_pair_suffix_grads,
    )
