"""Core initialization, rank gates and parameter counts shared by TT and TTM layers.

Gates follow docs/method.md#rank-gates: bond ``k`` (between cores ``k`` and ``k+1``) owns a vector
``g_k`` of length ``r_k``; the gated core is ``G_k * mu(g_k)`` on its last index with
``mu(g) = g * 1[g > tau]``. The last core is never gated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "init_cores",
    "gate_mu",
    "gated_cores",
    "active_ranks",
    "chain_numel",
]


def init_cores(
    core_shapes: Sequence[tuple[int, ...]],
    variance: float,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> list[Tensor]:
    """Gaussian cores whose full tensor has E[entry^2] = ``variance`` (gates at 1).

    Core ``k`` is drawn from N(0, variance^(1/K) / r_k) with ``r_k`` its right rank: the
    product of the K variances times the number of rank paths (prod of internal ranks) is
    ``variance``, as in the authors' code.
    """
    k = len(core_shapes)
    out = []
    for shape in core_shapes:
        std = math.sqrt(variance ** (1.0 / k) / shape[-1])
        g = torch.empty(shape, device=device, dtype=dtype)
        if not g.is_meta:  # a meta core has no values (engine.nn.meta)
            g.normal_(0.0, std, generator=generator)
        out.append(g)
    return out


def gate_mu(gate: Tensor, tau: float) -> Tensor:
    """``mu(g) = g`` where ``g > tau`` else 0 (negatives included)."""
    return F.threshold(gate, tau, 0.0)


def gated_cores(cores: Sequence[Tensor], gates: Sequence[Tensor], tau: float) -> list[Tensor]:
    """``G_k * mu(g_k)`` on the last index for all but the last core (autograd-friendly)."""
    out = [c * gate_mu(g, tau) for c, g in zip(cores[:-1], gates, strict=True)]
    out.append(cores[-1])
    return out


def active_ranks(gates: Sequence[Tensor], tau: float) -> tuple[int, ...]:
    """Full rank vector ``(1, #{g_1 > tau}, ..., 1)`` counted from the gates."""
    return (1, *(int((g > tau).sum()) for g in gates), 1)


def chain_numel(mode_sizes: Sequence[int], ranks: Sequence[int]) -> int:
    """Exact entries of a chain with per-core mode sizes ``s_k`` and full ranks.

    A chain whose internal bond has rank 0 is identically zero and counts 0, as the
    size model says (docs/method.md#size-model).
    """
    if any(r == 0 for r in ranks):
        return 0
    return sum(ranks[k] * s * ranks[k + 1] for k, s in enumerate(mode_sizes))
