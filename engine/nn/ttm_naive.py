"""Naive TTM embedding lookup: every token contracts its own slice of every core.

This is the "standard TTM lookup" baseline of docs/method.md#ttm-lookup and of
``bench/ttm_embedding``: no reuse at the tensor-index level (nothing is pre-merged) nor at the
row-index level (repeated ids are recomputed), and the backward is plain autograd through the
gathers and batched GEMMs.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from engine.tt.cores import gated_cores

__all__ = ["ttm_lookup_naive"]


def ttm_lookup_naive(ids: Tensor, cores: Sequence[Tensor], gates: Sequence[Tensor], tau: float):
    """Rows ``ids`` (any integer shape ``(...)``) of the gated TTM table: ``(..., D)``.

    Token ``t`` is unravelled row-major into ``(i_1..i_K)``; its row is
    ``G~_1[0, i_1] @ G~_2[:, i_2] @ ... @ G_K[:, i_K]`` with every slice gathered per token.
    """
    gated = gated_cores(cores, gates, tau)  # each (a, n, m, b)
    flat = ids.reshape(-1)  # (T,)
    digits = []
    rest = flat
    for g in reversed(gated):
        n = g.shape[1]
        digits.append(rest % n)  # (T,)
        rest = rest // n  # (T,)
    digits.reverse()
    t = flat.shape[0]
    x = None
    for g, i in zip(gated, digits, strict=True):
        a, _, m, b = g.shape
        s = g.permute(1, 0, 2, 3)[i]  # (T, a, m, b): this token's slice of core k
        if x is None:
            x = s.reshape(t, m, b)  # (T, m_1, r_1)
        else:
            x = x.bmm(s.reshape(t, a, m * b))  # (T, m_1..m_{k-1}, m_k r_k)
            x = x.reshape(t, -1, b)  # (T, m_1..m_k, r_k)
    return x.reshape(*ids.shape, -1)  # (..., D)
