"""TTLinear: a linear layer stored as tensor-train cores with trainable rank gates.

The weight ``W`` (out, in) is never stored: ``W^T`` (in, out) is the merge of ``2d`` cores,
input modes first (``G_1..G_d`` with mode sizes ``n_k``), then output modes
(``G_{d+1}..G_{2d}`` with ``m_k``); see docs/method.md#tt-linear-format and
:mod:`engine.contract.plan`. Sizes that do not factor well are padded (the padding is in
``extra_repr``); padded rows and columns never reach the output. ``kernel``
(:class:`engine.kernels.KernelPref`, default AUTO) picks the torch ops or the Triton kernels
for the fused plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from engine.contract.execute import TTLinearMeta
from engine.contract.plan import Plan
from engine.contract.reference import tt_linear_weight
from engine.kernels.backend import KernelPref
from engine.nn.functional import parse_plan, tt_linear
from engine.nn.gated import KernelChoice, positive_int
from engine.nn.params import ParamList
from engine.nn.premerge import premerged_linear
from engine.tt.cores import active_ranks, chain_numel, init_cores
from engine.tt.decompose import matrix_to_tt
from engine.tt.shapes import default_order, resolve_modes, resolve_ranks
from engine.tt.surgery import SliceMap, fold_gates_chain_, shrink_chain_

__all__ = ["TTLinear"]


class TTLinear(KernelChoice, nn.Module):
    """``y = x W^T + b`` with ``W`` in TT format and one rank gate per internal bond."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        max_rank: int | None = None,
        in_modes: Sequence[int] | None = None,
        out_modes: Sequence[int] | None = None,
        ranks: Sequence[int] | None = None,
        gate_threshold: float = 1e-2,
        d: int | None = None,
        plan: str | Plan = "auto",
        kernel: KernelPref | str = KernelPref.AUTO,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.in_features = positive_int(in_features, "in_features")
        self.out_features = positive_int(out_features, "out_features")
        if not 0 <= gate_threshold < 1:  # gates start at 1: tau >= 1 would mask everything
            raise ValueError(f"gate_threshold must be in [0, 1), got {gate_threshold}")
        if d is not None:
            positive_int(d, "d")
        if d is None and in_modes is None and out_modes is None:
            d = default_order(max(in_features, out_features))
        if d is None:
            d = len(in_modes if in_modes is not None else out_modes)  # type: ignore[arg-type]
        fin = resolve_modes(in_features, in_modes, d=d, name="in_modes", descending=True)
        fout = resolve_modes(out_features, out_modes, d=d, name="out_modes")
        self.in_modes, self.out_modes = fin.modes, fout.modes
        self.gate_threshold = float(gate_threshold)
        self.plan = parse_plan(plan)
        full = resolve_ranks(self.in_modes + self.out_modes, max_rank=max_rank, ranks=ranks)
        shapes = [(full[k], s, full[k + 1]) for k, s in enumerate(self.mode_sizes)]
        kw = {"device": device, "dtype": dtype}
        self.cores = ParamList([nn.Parameter(torch.empty(s, **kw)) for s in shapes])
        self.gates = ParamList([nn.Parameter(torch.ones(r, **kw)) for r in full[1:-1]])
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self.reset_parameters()

    # -- construction -------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """Cores with E[W_ij^2] = 1/(in+out); gates at 1; bias U(-1/sqrt(out), 1/sqrt(out))."""
        shapes = [tuple(c.shape) for c in self.cores]
        variance = 1.0 / (self.in_features + self.out_features)
        first = self.cores[0]  # draw on the cores' own device and dtype (free on meta)
        inits = init_cores(shapes, variance, device=first.device, dtype=first.dtype)
        with torch.no_grad():
            for p, init in zip(self.cores, inits, strict=True):
                p.copy_(init)
            for g in self.gates:
                g.fill_(1.0)
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.out_features)
                self.bias.uniform_(-bound, bound)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        *,
        max_rank: int | None = None,
        tol: float | None = None,
        in_modes: Sequence[int] | None = None,
        out_modes: Sequence[int] | None = None,
        gate_threshold: float = 1e-2,
        d: int | None = None,
        plan: str | Plan = "auto",
        kernel: KernelPref | str = KernelPref.AUTO,
    ) -> TTLinear:
        """TT-SVD of ``linear.weight`` to ``max_rank`` and/or relative tolerance ``tol``."""
        return cls.from_weight(
            linear.weight,
            linear.bias,
            max_rank=max_rank,
            tol=tol,
            in_modes=in_modes,
            out_modes=out_modes,
            gate_threshold=gate_threshold,
            d=d,
            plan=plan,
            kernel=kernel,
        )

    @classmethod
    def from_weight(
        cls,
        weight: Tensor,
        bias: Tensor | None = None,
        *,
        max_rank: int | None = None,
        tol: float | None = None,
        in_modes: Sequence[int] | None = None,
        out_modes: Sequence[int] | None = None,
        gate_threshold: float = 1e-2,
        d: int | None = None,
        plan: str | Plan = "auto",
        kernel: KernelPref | str = KernelPref.AUTO,
    ) -> TTLinear:
        """TT-SVD of a torch ``(out, in)`` ``weight`` to ``max_rank`` and/or relative
        tolerance ``tol``; cores and gates (at 1) in its dtype and on its device, ``bias``
        copied."""
        w = weight.detach()
        layer = cls(
            w.shape[1],
            w.shape[0],
            bias is not None,
            max_rank=max_rank if max_rank is not None else 1,
            in_modes=in_modes,
            out_modes=out_modes,
            gate_threshold=gate_threshold,
            d=d,
            plan=plan,
            kernel=kernel,
            device=torch.device("meta"),
            dtype=w.dtype,
        )
        cores = matrix_to_tt(w, layer.in_modes, layer.out_modes, max_rank=max_rank, tol=tol)
        # contiguous: a checkpoint loads contiguous cores, and a strided one can round
        # differently in the BLAS (a resumed run would then not be the same run)
        layer.cores = ParamList([nn.Parameter(c.to(w.dtype).contiguous()) for c in cores])
        layer.gates = ParamList(
            [
                nn.Parameter(torch.ones(c.shape[-1], dtype=w.dtype, device=w.device))
                for c in cores[:-1]
            ]
        )
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach().clone())
        return layer

    # -- compute ------------------------------------------------------------------------
    @property
    def meta(self) -> TTLinearMeta:
        return TTLinearMeta(
            self.in_modes,
            self.out_modes,
            self.in_features,
            self.out_features,
            self.gate_threshold,
            self.kernel,
        )

    def forward(self, x: Tensor, activation: str | None = None) -> Tensor:
        """``x W^T + b``; ``activation="gelu"``: ``gelu(x) W^T + b`` without storing
        ``gelu(x)`` for backward (it is recomputed there from ``x``)."""
        y = premerged_linear(self, x, activation)  # a fast-path session's group merge, if open
        if y is not None:
            return y
        return tt_linear(
            x, list(self.cores), list(self.gates), self.bias, self.meta, self.plan, activation
        )

    def to_dense(self, dtype: torch.dtype | None = None) -> Tensor:
        """The effective weight (out, in), gates applied; computed in ``dtype`` if given
        (the parameters cast first: float64 for an exact reference)."""
        cores, gates = list(self.cores), list(self.gates)
        if dtype is not None:
            cores, gates = [c.to(dtype) for c in cores], [g.to(dtype) for g in gates]
        return tt_linear_weight(
            cores,
            gates,
            self.gate_threshold,
            self.in_features,
            self.out_features,
            len(self.in_modes),
        )

    # -- ranks and sizes ----------------------------------------------------------------
    @property
    def mode_sizes(self) -> tuple[int, ...]:
        return self.in_modes + self.out_modes

    @property
    def ranks(self) -> tuple[int, ...]:
        """Full rank vector of the stored cores."""
        return (1, *(int(c.shape[-1]) for c in list(self.cores)[:-1]), 1)

    def active_ranks(self) -> tuple[int, ...]:
        """Ranks counted from the gates (entries above the threshold)."""
        return active_ranks(list(self.gates), self.gate_threshold)

    def tt_parameters(self) -> int:
        """Core entries at the stored ranks."""
        return chain_numel(self.mode_sizes, self.ranks)

    def num_parameters(self) -> int:
        """Every stored parameter: cores, gates and bias."""
        return sum(p.numel() for p in self.parameters())

    def dense_parameters(self) -> int:
        return self.in_features * self.out_features

    def compression_ratio(self) -> float:
        """Dense weight entries over TT core entries (bias excluded on both sides)."""
        tt = self.tt_parameters()
        return math.inf if tt == 0 else self.dense_parameters() / tt

    def shrink_(self) -> SliceMap:
        """Slice every bond to its live gate entries; output unchanged. Returns the slices."""
        return shrink_chain_(list(self.cores), list(self.gates), self.gate_threshold)

    def fold_gates_(self) -> None:
        """Fold ``mu(g)`` into the cores and reset the gates to 1 (for export)."""
        fold_gates_chain_(list(self.cores), list(self.gates), self.gate_threshold)

    def extra_repr(self) -> str:
        pad_in = math.prod(self.in_modes) - self.in_features
        pad_out = math.prod(self.out_modes) - self.out_features
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, in_modes={self.in_modes}, "
            f"out_modes={self.out_modes}, ranks={self.ranks}, padding=({pad_in}, {pad_out}), "
            f"tt_params={self.tt_parameters()}, compression={self.compression_ratio():.1f}x"
            + (f", kernel={self.kernel.value}" if self.kernel is not KernelPref.AUTO else "")
        )
