"""Tensor-train decompositions: TT-SVD, TT rounding, and layer-layout helpers.

Core chain convention: cores G_k of shape (r_{k-1}, s_k, r_k) with r_0 = r_K = 1, so
T[i_1..i_K] = G_1[0, i_1, :] G_2[:, i_2, :] ... G_K[:, i_K, 0].
All factorizations run in float64 (complex128 for complex input) on the input's device;
cores come back in the input dtype (float64 for integer input).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

__all__ = ["embedding_to_ttm", "matrix_to_tt", "tt_round", "tt_svd", "tt_to_full"]

MaxRank = int | Sequence[int] | None


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.complex128 if t.is_complex() else torch.float64


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if (t.is_floating_point() or t.is_complex()) else torch.float64


def _rank_caps(max_rank: MaxRank, n_ranks: int) -> list[int | None]:
    """One cap (or None) per internal rank."""
    if max_rank is None:
        return [None] * n_ranks
    if isinstance(max_rank, Sequence):
        caps = [operator.index(r) for r in max_rank]
        if len(caps) != n_ranks:
            raise ValueError(
                f"max_rank must have {n_ranks} entries (one per internal rank), got {len(caps)}"
            )
    else:
        caps = [operator.index(max_rank)] * n_ranks
    if any(r < 1 for r in caps):
        raise ValueError(f"max_rank must be >= 1, got {max_rank!r}")
    return caps


def _check_tol(tol: float | None) -> None:
    if tol is not None and not tol >= 0:  # also rejects NaN
        raise ValueError(f"tol must be >= 0, got {tol!r}")


def _check_modes(modes: Sequence[int], name: str) -> list[int]:
    out = [operator.index(m) for m in modes]
    if not out or any(m < 1 for m in out):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {modes!r}")
    return out


def _choose_rank(s: torch.Tensor, cap: int | None, delta: float | None) -> int:
    """Smallest rank whose discarded tail sqrt(sum s_i^2) <= delta, capped by `cap`."""
    r = s.numel()
    if delta is not None:
        tail = torch.flip(torch.cumsum(torch.flip(s * s, (0,)), 0), (0,))  # (n,) tail[i]=sum_{j>=i}
        ok = torch.cat([tail[1:], tail.new_zeros(1)]) <= delta * delta  # (n,) ok[i]: keep i+1
        r = int(torch.nonzero(ok)[0, 0].item()) + 1
    if cap is not None:
        r = min(r, cap)
    return max(r, 1)


def _delta(tol: float | None, norm: float, n_svds: int) -> float | None:
    return None if tol is None else tol / math.sqrt(max(n_svds, 1)) * norm


def _svd(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of ``m (a, b)`` with a fixed sign per singular pair: each column of ``u`` has
    its largest-magnitude entry real and positive (``vh``'s row turns with it). LAPACK's signs
    depend on the build and the CPU's code path, so without this the same weight could give
    cores of other signs on another machine, or on this one under another kernel."""
    u, s, vh = torch.linalg.svd(m, full_matrices=False)  # (a, q), (q,), (q, b)
    if u.numel():
        pivot = u.gather(0, u.abs().argmax(0, keepdim=True))  # (1, q)
        phase = pivot / pivot.abs().clamp_min(torch.finfo(s.dtype).tiny)  # (1, q), |phase| = 1
        phase = torch.where(pivot == 0, torch.ones_like(phase), phase)
        u, vh = u * phase.conj(), vh * phase.mT  # u diag(conj p) diag(p) vh = u vh
    return u, s, vh


def tt_svd(
    tensor: torch.Tensor, max_rank: MaxRank = None, tol: float | None = None
) -> list[torch.Tensor]:
    """TT-SVD (Oseledets 2011); with tol, ||T - TT||_F <= tol * ||T||_F."""
    _check_tol(tol)
    if tensor.ndim < 1 or tensor.numel() == 0:
        raise ValueError(f"tensor must be non-empty with >= 1 dim, got shape {tuple(tensor.shape)}")
    shape = list(tensor.shape)
    k_dims = len(shape)
    caps = _rank_caps(max_rank, k_dims - 1)
    out_dtype = _out_dtype(tensor)
    c = tensor.to(_work_dtype(tensor))  # (s_1, ..., s_K)
    delta = _delta(tol, float(torch.linalg.vector_norm(c)), k_dims - 1)
    cores: list[torch.Tensor] = []
    r_prev = 1
    for k in range(k_dims - 1):
        c = c.reshape(r_prev * shape[k], -1)  # (r_{k-1} s_k, s_{k+1} ... s_K)
        u, s, vh = _svd(c)  # (m, q), (q,), (q, n)
        r = _choose_rank(s, caps[k], delta)
        cores.append(u[:, :r].reshape(r_prev, shape[k], r).to(out_dtype))  # (r_{k-1}, s_k, r_k)
        c = s[:r, None] * vh[:r]  # (r_k, s_{k+1} ... s_K)
        r_prev = r
    cores.append(c.reshape(r_prev, shape[-1], 1).to(out_dtype))  # (r_{K-1}, s_K, 1)
    return cores


def _check_chain(cores: Sequence[torch.Tensor]) -> None:
    if len(cores) == 0:
        raise ValueError("cores must be a non-empty list")
    for k, g in enumerate(cores):
        if g.ndim != 3:
            raise ValueError(f"cores[{k}] must be 3-D (r, s, r), got shape {tuple(g.shape)}")
        if k > 0 and cores[k - 1].shape[2] != g.shape[0]:
            raise ValueError(f"cores[{k - 1}] and cores[{k}] have mismatched ranks")
    if cores[0].shape[0] != 1 or cores[-1].shape[2] != 1:
        raise ValueError("cores must have boundary ranks r_0 = r_K = 1")


def tt_round(
    cores: Sequence[torch.Tensor], max_rank: MaxRank = None, tol: float | None = None
) -> list[torch.Tensor]:
    """TT rounding: right-to-left QR, then left-to-right truncated SVD (no full tensor)."""
    _check_tol(tol)
    _check_chain(cores)
    n = len(cores)
    caps = _rank_caps(max_rank, n - 1)
    out_dtype = _out_dtype(cores[0])
    g = [c.to(_work_dtype(c)) for c in cores]  # each (r_{k-1}, s_k, r_k)
    for k in range(n - 1, 0, -1):  # right-orthogonalize cores 2..K
        r0, s, r1 = g[k].shape
        q, rr = torch.linalg.qr(g[k].reshape(r0, s * r1).mT)  # (s r_k, q), (q, r_{k-1})
        g[k] = q.mT.reshape(-1, s, r1)  # (q, s_k, r_k)
        g[k - 1] = torch.tensordot(g[k - 1], rr.mT, dims=1)  # (r_{k-2}, s_{k-1}, q)
    delta = _delta(tol, float(torch.linalg.vector_norm(g[0])), n - 1)
    for k in range(n - 1):
        r0, s, r1 = g[k].shape
        u, sv, vh = _svd(g[k].reshape(r0 * s, r1))
        r = _choose_rank(sv, caps[k], delta)
        g[k] = u[:, :r].reshape(r0, s, r)  # (r_{k-1}, s_k, r)
        g[k + 1] = torch.tensordot(sv[:r, None] * vh[:r], g[k + 1], dims=1)  # (r, s_{k+1}, r_{k+1})
    return [c.to(out_dtype) for c in g]


def tt_to_full(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dense tensor (s_1, ..., s_K) of a core chain (reference; exponential size)."""
    _check_chain(cores)
    full = cores[0].reshape(cores[0].shape[1], -1)  # (s_1, r_1)
    for g in cores[1:]:
        r0, s, r1 = g.shape
        full = (full @ g.reshape(r0, s * r1)).reshape(-1, r1)  # (s_1 .. s_k, r_k)
    return full.reshape([g.shape[1] for g in cores])  # (s_1, ..., s_K)


def _pad2d(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    if (rows, cols) == tuple(x.shape):
        return x
    out = x.new_zeros(rows, cols)  # (rows, cols)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def _check_mode_pair(
    rows: Sequence[int], cols: Sequence[int], rows_name: str, cols_name: str
) -> tuple[list[int], list[int]]:
    """Both mode lists of a matrix layout, checked, and of the same length."""
    row_modes, col_modes = _check_modes(rows, rows_name), _check_modes(cols, cols_name)
    if len(row_modes) != len(col_modes):
        raise ValueError(
            f"{rows_name} and {cols_name} must have the same length, got {len(row_modes)} "
            f"and {len(col_modes)}"
        )
    return row_modes, col_modes


def _padded_size(modes: Sequence[int], size: int, modes_name: str, size_name: str) -> int:
    """``prod(modes)``, which must hold ``size`` (the rest is zero padding)."""
    padded = math.prod(modes)
    if padded < size:
        raise ValueError(f"{modes_name} product {padded} is smaller than {size_name} {size}")
    return padded


def matrix_to_tt(
    weight: torch.Tensor,
    in_modes: Sequence[int],
    out_modes: Sequence[int],
    max_rank: MaxRank = None,
    tol: float | None = None,
) -> list[torch.Tensor]:
    """TT-linear cores (2d cores, input modes first) of a torch (out, in) weight."""
    n_modes, m_modes = _check_mode_pair(in_modes, out_modes, "in_modes", "out_modes")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D (out, in), got shape {tuple(weight.shape)}")
    m_real, n_real = weight.shape
    n_pad = _padded_size(n_modes, n_real, "in_modes", "in_features")
    m_pad = _padded_size(m_modes, m_real, "out_modes", "out_features")
    wt = _pad2d(weight.T, n_pad, m_pad)  # (N', M')
    return tt_svd(wt.reshape(n_modes + m_modes), max_rank=max_rank, tol=tol)


def embedding_to_ttm(
    table: torch.Tensor,
    row_modes: Sequence[int],
    col_modes: Sequence[int],
    max_rank: MaxRank = None,
    tol: float | None = None,
) -> list[torch.Tensor]:
    """TTM cores (r_{k-1}, n_k, m_k, r_k) of a (V, D) embedding table."""
    n_modes, m_modes = _check_mode_pair(row_modes, col_modes, "row_modes", "col_modes")
    k_dims = len(n_modes)
    if table.ndim != 2:
        raise ValueError(f"table must be 2-D (V, D), got shape {tuple(table.shape)}")
    v_real, d_real = table.shape
    v_pad = _padded_size(n_modes, v_real, "row_modes", "num_embeddings")
    d_pad = _padded_size(m_modes, d_real, "col_modes", "embedding_dim")
    e = _pad2d(table, v_pad, d_pad).reshape(n_modes + m_modes)  # (n_1..n_K, m_1..m_K)
    perm = [p for k in range(k_dims) for p in (k, k_dims + k)]
    merged = [n * m for n, m in zip(n_modes, m_modes, strict=True)]
    e = e.permute(perm).reshape(merged)  # (n_1 m_1, ..., n_K m_K)
    cores = tt_svd(e, max_rank=max_rank, tol=tol)  # each (r_{k-1}, n_k m_k, r_k)
    return [
        g.reshape(g.shape[0], n, m, g.shape[2])  # (r_{k-1}, n_k, m_k, r_k)
        for g, n, m in zip(cores, n_modes, m_modes, strict=True)
    ]
