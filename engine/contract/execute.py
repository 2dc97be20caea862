"""Executing a TT-linear contraction plan with torch ops.

The fused plan (both sides merged) runs in :class:`TTLinearFunction`, a custom autograd
function that applies the gates itself and saves only ``x``, ``T1 = x L`` (B, r) and the
small batch-independent merge intermediates; its backward is six skinny GEMMs plus the merge
backward, with the bias gradient fused into the ``dR`` GEMM by a column of ones. Plans with
a swept side, and the dense plan, are compositions of torch ops under autograd.

``activation="gelu"`` computes ``gelu(x) W^T + b`` from the pre-activation ``x``. The fused
plan then saves ``x`` instead of ``gelu(x)`` and recomputes ``gelu(x)`` in backward (one
elementwise pass), so a ``fc1 -> gelu -> fc2`` block keeps one (B, F) tensor, not two.

``TTLinearMeta.kernel`` (:class:`engine.kernels.KernelPref`, default AUTO) runs the fused plan
on the Triton kernels (:mod:`engine.kernels.skinny` for the skinny products, with ``gelu``,
``gelu'`` and the bias column fused in, :mod:`engine.kernels.merge` for the merges) where
:func:`engine.kernels.resolve_backend` says so; AUTO on CPU tensors runs exactly the torch
ops. The other plans always run on torch ops.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.contract.lowrank_saved import recomputing, tag_output
from engine.contract.plan import Plan, Side
from engine.kernels.backend import Backend, KernelPref, resolve_backend
from engine.kernels.merge import merge_chain, merge_chain_backward
from engine.kernels.skinny import skinny_mm, skinny_tmm, wide_mm
from engine.tt.chain import merge, merge_backward
from engine.tt.cores import gate_mu, gated_cores

__all__ = [
    "ACTIVATIONS",
    "Merged",
    "TTLinearMeta",
    "TTLinearFunction",
    "merge_gated",
    "param_grads",
    "run_plan",
    "with_bias",
]

ACTIVATIONS = (None, "gelu")  # input activations the executor can fuse


class TTLinearMeta(NamedTuple):
    """The static description of a TT-linear that the executor needs (hashable)."""

    in_modes: tuple[int, ...]
    out_modes: tuple[int, ...]
    in_features: int
    out_features: int
    tau: float
    kernel: KernelPref = KernelPref.AUTO  # torch or Triton for the fused plan


# Below this many rows MKL's GEMM with a skinny (<= ~32 columns) output is faster computed as
# the transposed product (measured on the 2-core CI machine: 128 x 3072 x 30 takes 143 us as
# (R dY^T)^T against 236 us as dY R^T; from 512 rows on the direct form wins).
_TRANSPOSED_BELOW_ROWS = 256


def _skinny(a: Tensor, b: Tensor) -> Tensor:
    """a (B, K) @ b (K, r) for small r, in the faster orientation for B."""
    if a.shape[0] < _TRANSPOSED_BELOW_ROWS:
        return (b.T @ a.T).T  # (B, r) as a transposed view
    return a @ b  # (B, r)


def _first_product(x: Tensor, left: Tensor, with_ones: bool) -> Tensor:
    """``x @ left`` (B, r), with a trailing column of ones when ``with_ones``."""
    r = left.shape[1]
    if x.shape[0] < _TRANSPOSED_BELOW_ROWS:
        t1t = x.new_empty(r + int(with_ones), x.shape[0])  # (r [+ 1], B)
        torch.mm(left.T, x.T, out=t1t[:r])
        if with_ones:
            t1t[r].fill_(1.0)
        return t1t.T  # (B, r [+ 1]) view
    t1 = x @ left  # (B, r)
    return torch.cat([t1, t1.new_ones(t1.shape[0], 1)], dim=1) if with_ones else t1


class Merged(NamedTuple):
    """One TT-linear's gated cores merged into ``W^T = L R`` (batch independent)."""

    left: Tensor  # (N, r) view, padded input rows dropped
    right: Tensor  # (r, M) view, padded output columns dropped
    cores: tuple[Tensor, ...]
    flat_gates: Tensor  # (sum r_k,)
    mus: tuple[Tensor, ...]  # mu(g_k), (r_k,) each
    gated: list[Tensor]  # G_k * mu(g_k), the last core as is
    saved_l: list[Tensor]
    saved_r: list[Tensor]


def merge_gated(
    meta: TTLinearMeta, dirs: tuple[Side, Side], cores, gates, backend: Backend = "torch"
) -> Merged:
    """Gate the cores and merge both halves (the forward's batch-independent part)."""
    d = len(meta.in_modes)
    # all gates thresholded in one op, applied with one foreach call (fewer launches)
    flat_gates = torch.cat(gates)  # (sum r_k,)
    mus = gate_mu(flat_gates, meta.tau).split([g.shape[0] for g in gates])  # (r_k,) each
    gated = [*torch._foreach_mul(cores[:-1], mus), cores[-1]]
    if backend == "triton":
        left, saved_l = merge_chain(gated[:d], dirs[0], backend)  # (N', r)
        right, saved_r = merge_chain(gated[d:], dirs[1], backend)  # (r M', 1)
    else:
        left, saved_l = merge(gated[:d], dirs[0])  # (N', r)
        right, saved_r = merge(gated[d:], dirs[1])  # (r M', 1)
    r = left.shape[1]
    left = left[: meta.in_features]  # (N, r)  view: padded input rows dropped
    right = right.view(r, -1)[:, : meta.out_features]  # (r, M)  view
    return Merged(left, right, tuple(cores), flat_gates, tuple(mus), gated, saved_l, saved_r)


def param_grads(
    meta: TTLinearMeta,
    dirs: tuple[Side, Side],
    m: Merged,
    d_left: Tensor,
    d_right: Tensor,
    backend: Backend = "torch",
) -> tuple[list[Tensor], list[Tensor]]:
    """Core and gate gradients from ``dL`` (N, r) and ``dR`` (r, M): the merge backward."""
    d, r = len(meta.in_modes), m.left.shape[1]
    n_full = _prod(g.shape[1] for g in m.gated[:d])
    m_full = _prod(g.shape[1] for g in m.gated[d:])
    if n_full != meta.in_features:
        d_left = torch.cat([d_left, d_left.new_zeros(n_full - meta.in_features, r)])
    if m_full != meta.out_features:
        pad = d_right.new_zeros(r, m_full - meta.out_features)
        d_right = torch.cat([d_right, pad], dim=1)
    if backend == "triton":
        d_gated = merge_chain_backward(m.gated[:d], m.saved_l, d_left, dirs[0], backend)
        d_gated += merge_chain_backward(m.gated[d:], m.saved_r, d_right, dirs[1], backend)
    else:
        d_gated = merge_backward(m.gated[:d], m.saved_l, d_left, dirs[0])
        d_gated += merge_backward(m.gated[d:], m.saved_r, d_right, dirs[1])
    n_gates = len(m.mus)
    d_cores = [*torch._foreach_mul(d_gated[:n_gates], m.mus), d_gated[-1]]  # (a, s, b) each
    prods = torch._foreach_mul(d_gated[:n_gates], m.cores[:n_gates])
    d_mu = torch.cat([p.sum(dim=(0, 1)) for p in prods])  # (sum r_k,)
    d_flat = torch.ops.aten.threshold_backward(d_mu, m.flat_gates, meta.tau)
    return d_cores, list(d_flat.split([mu.shape[0] for mu in m.mus]))


def with_bias(right: Tensor, bias: Tensor | None) -> Tensor:
    """``[R; b]`` (r + 1, M): the bias rides along as an extra rank, so ``[T, 1] [R; b]``
    adds it and backward gets ``db`` from the same GEMM as ``dR``."""
    return torch.cat([right, bias.unsqueeze(0)]) if bias is not None else right


class TTLinearFunction(torch.autograd.Function):
    """y = x L R + b with gated cores; ``params = (*cores, *gates)``.

    Only ``x`` and ``[x L, 1]`` (B, r + 1) go through ``save_for_backward``; the small
    batch-independent tensors (cores, gates, merge intermediates) are kept on ``ctx``.
    ``backend="triton"`` runs the products on :mod:`engine.kernels.skinny` (``gelu(x)`` is then
    never materialized, in forward or backward).
    """

    @staticmethod
    def forward(
        ctx, x, bias, meta: TTLinearMeta, dirs: tuple[Side, Side], act, backend: Backend, *params
    ):
        n_cores = len(meta.in_modes) + len(meta.out_modes)
        m = merge_gated(meta, dirs, params[:n_cores], params[n_cores:], backend)
        if backend == "triton":
            t1 = skinny_mm(x, m.left, act or "none", bias is not None, True)  # (B, r [+ 1])
            rb = with_bias(m.right, bias)  # (r [+ 1], M)
            y = wide_mm(t1, rb, None, "none", True)  # (B, M)
        else:
            a = F.gelu(x) if act == "gelu" else x  # (B, N) not saved: recomputed in backward
            t1 = _first_product(a, m.left, with_ones=bias is not None)  # (B, r [+ 1])
            rb = with_bias(m.right, bias)  # (r [+ 1], M)
            y = t1 @ rb  # (B, M)
        if recomputing() and any(ctx.needs_input_grad):
            tag_output(y, t1, rb)  # consumers save (t1, rb), not y: see lowrank_saved
        ctx.meta, ctx.dirs, ctx.act, ctx.merged = meta, dirs, act, m
        ctx.backend = backend
        ctx.save_for_backward(x, t1)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, t1 = ctx.saved_tensors
        m = ctx.merged
        r = m.left.shape[1]
        if ctx.backend == "triton":
            return TTLinearFunction._backward_triton(ctx, dy, x, t1, m, r)
        u1 = _skinny(dy, m.right.T).contiguous()  # (B, r)
        dx = u1 @ m.left.T if ctx.needs_input_grad[0] else None  # (B, N)
        d_right = t1.T @ dy  # (r [+ 1], M)
        dbias = d_right[r] if t1.shape[1] > r else None  # (M,)
        if ctx.act == "gelu":
            d_left = (u1.T @ F.gelu(x)).T  # (N, r)
            dx = torch.ops.aten.gelu_backward(dx, x) if dx is not None else None  # (B, N)
        else:
            d_left = (u1.T @ x).T  # (N, r)
        d_cores, d_gates = param_grads(ctx.meta, ctx.dirs, m, d_left, d_right[:r])
        del ctx.merged
        return (dx, dbias, None, None, None, None, *d_cores, *d_gates)

    @staticmethod
    def _backward_triton(ctx, dy, x, t1, m: Merged, r: int):
        act = ctx.act or "none"
        u1 = skinny_mm(dy, m.right.T, "none", False, True)  # (B, r)
        pre = x if act == "gelu" else None
        dx = wide_mm(u1, m.left.T, pre, act, True) if ctx.needs_input_grad[0] else None  # (B, N)
        d_right = skinny_tmm(t1, dy, "none", True)  # (r [+ 1], M)
        dbias = d_right[r] if t1.shape[1] > r else None  # (M,)
        d_left = skinny_tmm(x, u1, act, True)  # (N, r): act(x)^T u1
        d_cores, d_gates = param_grads(ctx.meta, ctx.dirs, m, d_left, d_right[:r], "triton")
        del ctx.merged
        return (dx, dbias, None, None, None, None, *d_cores, *d_gates)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _sweep_in(x: Tensor, cores: list[Tensor], modes: tuple[int, ...]) -> Tensor:
    """Contract x (B, N') with input cores one at a time; returns (B, r_d)."""
    B = x.shape[0]
    t = x.reshape(B, modes[0], -1, 1)  # (B, n_1, rest, 1)
    for k, g in enumerate(cores):
        t = torch.einsum("bixa,aic->bxc", t, g)  # (B, rest_k, r_k)
        if k + 1 < len(cores):
            t = t.reshape(B, modes[k + 1], -1, t.shape[-1])  # (B, n_{k+1}, rest, r_k)
    return t.reshape(B, -1)  # (B, r_d)


def _sweep_out(t: Tensor, cores: list[Tensor]) -> Tensor:
    """Expand t (B, r_d) through the output cores one at a time; returns (B, M')."""
    B = t.shape[0]
    y = t.reshape(B, 1, -1)  # (B, 1, r_d)
    for g in cores:
        y = torch.einsum("bxa,ajc->bxjc", y, g)  # (B, done, m_k, r_k)
        y = y.reshape(B, -1, g.shape[-1])  # (B, done * m_k, r_k)
    return y.reshape(B, -1)  # (B, M')


def run_plan(
    x: Tensor,
    cores: list[Tensor],
    gates: list[Tensor],
    bias: Tensor | None,
    meta: TTLinearMeta,
    plan: Plan,
    activation: str | None = None,
) -> Tensor:
    """y (B, M) for x (B, N) under ``plan``; ``act(x)`` is the input when ``activation``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    d = len(meta.in_modes)
    n_in, n_out = meta.in_features, meta.out_features
    if plan.fused:
        tensors = (x, *cores, *gates) if bias is None else (x, bias, *cores, *gates)
        backend = resolve_backend(meta.kernel, *tensors)
        return TTLinearFunction.apply(
            x, bias, meta, (plan.input_side, plan.output_side), activation, backend, *cores, *gates
        )
    if activation == "gelu":
        x = F.gelu(x)  # (B, N)
    gated = gated_cores(cores, gates, meta.tau)
    if plan.kind == "dense":
        left, _ = merge(gated[:d], "ltr")  # (N', r)
        right, _ = merge(gated[d:], "rtl")  # (r M', 1)
        r = left.shape[1]
        w_t = left[:n_in] @ right.view(r, -1)[:, :n_out]  # (N, M)
        return torch.addmm(bias, x, w_t) if bias is not None else x @ w_t  # (B, M)
    if plan.input_side == "sweep":
        n_full = _prod(meta.in_modes)
        xp = torch.nn.functional.pad(x, (0, n_full - n_in)) if n_full != n_in else x
        t1 = _sweep_in(xp, gated[:d], meta.in_modes)  # (B, r)
    else:
        left, _ = merge(gated[:d], plan.input_side)  # (N', r)
        t1 = x @ left[:n_in]  # (B, r)
    if plan.output_side == "sweep":
        y = _sweep_out(t1, gated[d:])[:, :n_out]  # (B, M)
        return y + bias if bias is not None else y
    right, _ = merge(gated[d:], plan.output_side)  # (r M', 1)
    right = right.view(t1.shape[1], -1)[:, :n_out]  # (r, M)
    return torch.addmm(bias, t1, right) if bias is not None else t1 @ right  # (B, M)
