"""Obviously-correct dense reconstructions: the oracle for every fast path.

Written independently of :mod:`engine.tt.chain`: the full tensor is built by successive
``tensordot`` over the bond index, then reshaped into the matrix or table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from engine.tt.cores import gated_cores

__all__ = ["chain_full", "tt_linear_weight", "tt_linear_reference", "ttm_table"]


def chain_full(cores: Sequence[Tensor]) -> Tensor:
    """Full tensor of shape (*mode dims of every core) for cores (a, *modes, b), a_0 = b_K = 1."""
    full = cores[0].squeeze(0)  # (*modes_1, b_1)
    for g in cores[1:]:
        full = torch.tensordot(full, g, dims=([full.dim() - 1], [0]))  # (..., *modes_k, b_k)
    return full.squeeze(-1)


def tt_linear_weight(
    cores: Sequence[Tensor],
    gates: Sequence[Tensor],
    tau: float,
    in_features: int,
    out_features: int,
    d: int,
) -> Tensor:
    """Torch-layout weight W (out, in) of a gated TT-linear (padding cropped)."""
    full = chain_full(gated_cores(cores, gates, tau))  # (n_1..n_d, m_1..m_e)
    n_pad = math.prod(full.shape[:d])
    w_t = full.reshape(n_pad, -1)[:in_features, :out_features]  # (N, M)
    return w_t.T


def tt_linear_reference(x, cores, gates, bias, tau, in_features, out_features, d) -> Tensor:
    """y = x W^T + b through the dense reconstruction (autograd does the backward)."""
    w = tt_linear_weight(cores, gates, tau, in_features, out_features, d)
    y = x @ w.T
    return y + bias if bias is not None else y


def ttm_table(
    cores: Sequence[Tensor], gates: Sequence[Tensor], tau: float, num_embeddings: int, dim: int
) -> Tensor:
    """Dense table (V, D) of a gated TTM embedding with cores (a, n_k, m_k, b)."""
    full = chain_full(gated_cores(cores, gates, tau))  # (n_1, m_1, n_2, m_2, ...)
    k = len(cores)
    perm = [2 * i for i in range(k)] + [2 * i + 1 for i in range(k)]
    rows = math.prod(g.shape[1] for g in cores)
    table = full.permute(perm).reshape(rows, -1)  # (V', D')
    return table[:num_embeddings, :dim]
