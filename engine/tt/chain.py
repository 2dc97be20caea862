"""Merging a chain of TT cores into one matrix, and the exact backward of that merge.

A chain is a list of cores ``G_k`` of shape ``(a_{k-1}, s_k, a_k)``. Its merge is the matrix
``P`` of shape ``(a_0 * s_1 * ... * s_K, a_K)`` with

    P[(c, i_1..i_K), e] = sum G_1[c, i_1, :] G_2[:, i_2, :] ... G_K[:, i_K, e]

(row-major over ``(c, i_1, ..., i_K)``). Two orders give the same matrix:

* left to right (``ltr``): ``P_k = P_{k-1} @ G_k`` keeps prefixes; cheap when ``a_0 = 1``;
* right to left (``rtl``): ``S_k = G_k @ S_{k+1}`` keeps suffixes; cheap when ``a_K = 1``.

Both return the intermediates that their backward needs, so the backward does only GEMMs.
The multiply-add counts of both are in :func:`merge_macs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from torch import Tensor

Direction = Literal["ltr", "rtl"]
Step = Callable[[Tensor, Tensor], Tensor]  # one merge step: (prefix, core) or (core, suffix)
StepGrads = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]  # its backward

__all__ = ["Direction", "Step", "StepGrads", "merge", "merge_backward", "merge_macs"]


def _gemm_prefix_step(p: Tensor, g: Tensor) -> Tensor:
    """One left-to-right merge step: prefix ``p`` (any view of ``(rows, a)``) times core ``g``
    ``(a, s, b)``, as the new prefix ``(rows s, b)``."""
    a, s, b = g.shape
    return (p.reshape(-1, a) @ g.reshape(a, s * b)).reshape(-1, b)


def _gemm_suffix_step(g: Tensor, q: Tensor) -> Tensor:
    """One right-to-left merge step: core ``g`` ``(a, s, b)`` times suffix ``q`` ``(b, cols)``,
    as the new suffix ``(a, s cols)``."""
    a, s, b = g.shape
    q = g.reshape(a * s, b) @ q  # (a_{k-1} s_k, s_{k+1}..s_K a_K)
    return q.reshape(a, -1)


def _gemm_prefix_grads(d_p: Tensor, prev: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of :func:`_gemm_prefix_step`: ``(dL/dg, dL/dprev)`` given ``d_p`` (any view of
    the new prefix's shape) and ``prev`` ``(rows, a)``."""
    a, s, b = g.shape
    d_pk = d_p.reshape(-1, s * b)  # (rows_{k-1}, s_k a_k)
    d_g = (prev.T @ d_pk).reshape(a, s, b)  # (a_{k-1}, s_k, a_k)
    return d_g, d_pk @ g.reshape(a, s * b).T  # (rows_{k-1}, a_{k-1})


def _gemm_suffix_grads(d_q: Tensor, g: Tensor, q_next: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of :func:`_gemm_suffix_step`: ``(dL/dg, dL/dq_next)`` given ``d_q`` (any view
    of the new suffix's shape) and ``q_next`` ``(b, cols)``."""
    a, s, b = g.shape
    d_qk = d_q.reshape(a * s, -1)  # (a_{k-1} s_k, rest_{k+1})
    d_g = (d_qk @ q_next.T).reshape(a, s, b)  # (a_{k-1}, s_k, a_k)
    return d_g, g.reshape(a * s, b).T @ d_qk  # (a_k, rest_{k+1})


def merge(
    cores: Sequence[Tensor],
    direction: Direction,
    *,
    prefix_step: Step = _gemm_prefix_step,
    suffix_step: Step = _gemm_suffix_step,
) -> tuple[Tensor, list[Tensor]]:
    """Merge ``cores``; returns ``(P, saved)`` with ``P`` of shape ``(a_0 * prod s, a_K)``.

    Each step is ``prefix_step`` (``ltr``) or ``suffix_step`` (``rtl``); the defaults are
    torch GEMMs (:mod:`engine.kernels.merge` passes its Triton ones)."""
    if direction == "ltr":
        p = cores[0].reshape(-1, cores[0].shape[-1])  # (a_0 s_1, a_1)
        saved = [p]
        for g in cores[1:]:
            p = prefix_step(p, g)  # (a_0 s_1..s_k, a_k)
            saved.append(p)
        return p, saved[:-1]
    last = cores[-1]
    q = last.reshape(last.shape[0], -1)  # (a_{K-1}, s_K a_K)
    saved = [q]
    for g in reversed(cores[:-1]):
        q = suffix_step(g, q)  # (a_{k-1}, s_k..s_K a_K)
        saved.append(q)
    a_k = cores[-1].shape[-1]
    return q.reshape(-1, a_k), saved[:-1]


def merge_backward(
    cores: Sequence[Tensor],
    saved: Sequence[Tensor],
    grad: Tensor,
    direction: Direction,
    *,
    prefix_grads: StepGrads = _gemm_prefix_grads,
    suffix_grads: StepGrads = _gemm_suffix_grads,
) -> list[Tensor]:
    """Gradients of every core given ``grad`` = dLoss/dP (any view of P's shape); each step's
    backward is ``prefix_grads`` or ``suffix_grads`` (as :func:`merge`'s steps)."""
    n = len(cores)
    grads: list[Tensor] = [grad] * n
    if direction == "ltr":
        d_p = grad
        for k in range(n - 1, 0, -1):
            grads[k], d_p = prefix_grads(d_p, saved[k - 1], cores[k])
        grads[0] = d_p.reshape(cores[0].shape)
        return grads
    d_q = grad.reshape(cores[0].shape[0], -1)  # (a_0, rest)
    for k in range(n - 1):
        grads[k], d_q = suffix_grads(d_q, cores[k], saved[n - 2 - k])
    grads[n - 1] = d_q.reshape(cores[n - 1].shape)
    return grads


def merge_macs(shapes: Sequence[tuple[int, int, int]], direction: Direction) -> int:
    """Multiply-adds of :func:`merge` for cores of the given ``(a, s, b)`` shapes.

    The backward costs exactly twice this (two GEMMs of the same size per merge step).
    """
    total = 0
    if direction == "ltr":
        rows = shapes[0][0] * shapes[0][1]
        for a, s, b in shapes[1:]:
            total += rows * a * s * b
            rows *= s
        return total
    cols = shapes[-1][1] * shapes[-1][2]
    for a, s, b in reversed(shapes[:-1]):
        total += a * s * b * cols
        cols *= s
    return total
