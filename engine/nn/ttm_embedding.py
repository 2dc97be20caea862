"""TTM-compressed embedding table with rank gates and physical shrinking.

The table ``E (V', D)`` with ``V' = prod n_k >= V`` and ``D = prod m_k`` is held as cores
``G_k (r_{k-1}, n_k, m_k, r_k)`` and gates ``g_k (r_k,)`` on the internal bonds
(docs/method.md#ttm-embedding-format, docs/method.md#rank-gates). The lookup is
:func:`engine.nn.ttm_functional.ttm_lookup`; the dense oracle is
:func:`engine.contract.reference.ttm_table`. ``shrink_`` slices dead gate entries out of the
cores (docs/method.md#physical-shrinking) and reports the slices so optimizer state can
follow. ``kernel`` (:class:`engine.kernels.KernelPref`, default AUTO) picks the torch ops or
the Triton kernels.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from engine.contract.reference import ttm_table
from engine.kernels.backend import KernelPref
from engine.nn.gated import KernelChoice, positive_int
from engine.nn.params import ParamList
from engine.nn.ttm_functional import LookupPlan, make_plan, ttm_lookup
from engine.tt.cores import active_ranks, chain_numel, init_cores
from engine.tt.decompose import embedding_to_ttm
from engine.tt.shapes import default_order, factorize, resolve_modes, resolve_ranks
from engine.tt.surgery import SliceMap, fold_gates_chain_, shrink_chain_

__all__ = ["TTMEmbedding"]


def _resolve_layout(num_embeddings, embedding_dim, row_modes, col_modes, d):
    """Row modes (descending when automatic) and col modes (ascending, exact product)."""
    if d is None:
        given = row_modes if row_modes is not None else col_modes
        d = len(tuple(given)) if given is not None else default_order(num_embeddings)
    positive_int(d, "d")
    if d < 2:
        raise ValueError(f"d must be >= 2 (a TTM chain has at least two cores), got {d}")
    rows = resolve_modes(num_embeddings, row_modes, d=d, name="row_modes", descending=True).modes
    if col_modes is None:
        cols = tuple(sorted(factorize(embedding_dim, d, max_padding=0.0).modes))
    else:
        cols = resolve_modes(embedding_dim, col_modes, name="col_modes").modes
    if math.prod(cols) != embedding_dim:
        raise ValueError(f"col_modes {cols} must multiply to embedding_dim {embedding_dim} exactly")
    if len(rows) != d:
        raise ValueError(f"row_modes {rows} must have d = {d} entries")
    if len(cols) != len(rows):
        raise ValueError(f"col_modes {cols} must have as many entries as row_modes {rows}")
    return rows, cols


class TTMEmbedding(KernelChoice, nn.Module):
    """``nn.Embedding`` replacement whose table is a gated TTM chain."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        max_rank: int | None = None,
        row_modes: Sequence[int] | None = None,
        col_modes: Sequence[int] | None = None,
        ranks: Sequence[int] | None = None,
        gate_threshold: float = 1e-2,
        d: int | None = None,
        dedup: bool = True,
        padding_idx: int | None = None,
        kernel: KernelPref | str = KernelPref.AUTO,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.kernel = kernel
        positive_int(num_embeddings, "num_embeddings")
        positive_int(embedding_dim, "embedding_dim")
        if (
            isinstance(gate_threshold, bool)
            or not isinstance(gate_threshold, numbers.Real)
            or not 0 <= gate_threshold < 1
        ):
            raise ValueError(f"gate_threshold must be in [0, 1), got {gate_threshold!r}")
        rows, cols = _resolve_layout(num_embeddings, embedding_dim, row_modes, col_modes, d)
        sizes = [n * m for n, m in zip(rows, cols, strict=True)]
        full = resolve_ranks(sizes, max_rank=max_rank, ranks=ranks, name="ranks")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.row_modes, self.col_modes = rows, cols
        self.gate_threshold = float(gate_threshold)
        self.dedup = dedup
        if padding_idx is not None:
            if (
                isinstance(padding_idx, bool)
                or not isinstance(padding_idx, int)
                or not (-num_embeddings <= padding_idx < num_embeddings)
            ):
                raise ValueError(
                    f"padding_idx must be in [-{num_embeddings}, {num_embeddings}),"
                    f" got {padding_idx!r}"
                )
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        kw = {"device": device, "dtype": dtype}
        pairs = enumerate(zip(rows, cols, strict=True))
        shapes = [(full[k], n, m, full[k + 1]) for k, (n, m) in pairs]  # (r_{k-1}, n_k, m_k, r_k)
        self.cores = ParamList([nn.Parameter(torch.empty(s, **kw)) for s in shapes])
        self.gates = ParamList([nn.Parameter(torch.empty(r, **kw)) for r in full[1:-1]])
        self._plan: tuple[tuple, LookupPlan] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gaussian cores with E[E_ij^2] = 1 (as ``nn.Embedding``) and gates at 1."""
        with torch.no_grad():
            shapes = [tuple(c.shape) for c in self.cores]
            new = init_cores(shapes, 1.0, device=self.cores[0].device, dtype=self.cores[0].dtype)
            for c, n in zip(self.cores, new, strict=True):
                c.copy_(n)
            for g in self.gates:
                g.fill_(1.0)

    @classmethod
    def from_embedding(
        cls,
        emb: nn.Embedding,
        *,
        max_rank: int | None = None,
        tol: float | None = None,
        row_modes: Sequence[int] | None = None,
        col_modes: Sequence[int] | None = None,
        gate_threshold: float = 1e-2,
        d: int | None = None,
        dedup: bool = True,
        kernel: KernelPref | str = KernelPref.AUTO,
    ) -> TTMEmbedding:
        """TT-SVD of ``emb.weight`` (padded with zero rows) into TTM cores; gates at 1."""
        weight = emb.weight.detach()  # (V, D)
        v, dim = weight.shape
        rows, cols = _resolve_layout(v, dim, row_modes, col_modes, d)
        cores = embedding_to_ttm(weight, rows, cols, max_rank=max_rank, tol=tol)
        ranks = [c.shape[0] for c in cores] + [1]
        mod = cls(
            v,
            dim,
            row_modes=rows,
            col_modes=cols,
            ranks=ranks,
            gate_threshold=gate_threshold,
            dedup=dedup,
            padding_idx=emb.padding_idx,
            kernel=kernel,
            device="meta",
            dtype=weight.dtype,
        )
        for k, c in enumerate(cores):
            mod.cores[k] = nn.Parameter(c.to(weight.dtype).contiguous())
        for k, r in enumerate(ranks[1:-1]):
            mod.gates[k] = nn.Parameter(torch.ones(r, device=weight.device, dtype=weight.dtype))
        return mod

    # ---- sizes -------------------------------------------------------------------------------

    @property
    def ranks(self) -> tuple[int, ...]:
        """Full rank vector ``(1, r_1, ..., r_{K-1}, 1)`` of the current core shapes."""
        return (*(c.shape[0] for c in self.cores), 1)

    def active_ranks(self) -> tuple[int, ...]:
        return active_ranks(list(self.gates), self.gate_threshold)

    def tt_parameters(self) -> int:
        sizes = [n * m for n, m in zip(self.row_modes, self.col_modes, strict=True)]
        return chain_numel(sizes, self.ranks)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.cores) + sum(g.numel() for g in self.gates)

    def dense_parameters(self) -> int:
        return self.num_embeddings * self.embedding_dim

    def compression_ratio(self) -> float:
        tt = self.tt_parameters()
        return self.dense_parameters() / tt if tt else math.inf

    # ---- compute -----------------------------------------------------------------------------

    def _lookup_plan(self) -> LookupPlan:
        shapes = tuple(tuple(c.shape) for c in self.cores)
        if self._plan is None or self._plan[0] != shapes:
            self._plan = (shapes, make_plan(shapes))
        return self._plan[1]

    def forward(self, ids: Tensor) -> Tensor:
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor, got {ids.dtype}")
        # inside a CUDA-graph capture: no host read-back (range check) and no data-dependent
        # shape (dedup); every token's row is computed, which is the same table row
        capturing = ids.is_cuda and torch.cuda.is_current_stream_capturing()
        if ids.numel() and not capturing:
            lo, hi = (int(x) for x in torch.aminmax(ids))  # one pass over the ids
            if lo < 0 or hi >= self.num_embeddings:
                raise IndexError(f"ids must be in [0, {self.num_embeddings}), got {lo}..{hi}")
        if 0 in self.ranks:  # a dead bond: the table is identically zero
            # () empty sums: keeps every core and gate in the graph, their gradients empty
            zero = sum(t.sum() for t in (*self.cores, *self.gates))
            return zero.expand(*ids.shape, self.embedding_dim).contiguous()  # (..., D)
        cores, gates = list(self.cores), list(self.gates)
        plan = self._lookup_plan()
        out = ttm_lookup(
            ids,
            cores,
            gates,
            self.gate_threshold,
            dedup=self.dedup and not capturing,
            plan=plan,
            kernel=self.kernel,
        )  # (..., D)
        if self.padding_idx is not None:
            # as nn.Embedding: the padding row reads as zeros and sends no gradient
            out = out.masked_fill((ids == self.padding_idx).unsqueeze(-1), 0.0)  # (..., D)
        return out

    def to_dense(self) -> Tensor:
        """The table ``(num_embeddings, embedding_dim)`` through the dense oracle."""
        if 0 in self.ranks:
            c = self.cores[0]
            return c.new_zeros(self.num_embeddings, self.embedding_dim)
        table = ttm_table(
            list(self.cores),
            list(self.gates),
            self.gate_threshold,
            self.num_embeddings,
            self.embedding_dim,
        )  # (V, D)
        if self.padding_idx is not None:
            table = table.index_fill(0, torch.tensor([self.padding_idx], device=table.device), 0)
        return table

    # ---- rank changes ------------------------------------------------------------------------

    def shrink_(self) -> SliceMap:
        """Slice dead gate entries out of the cores and gates in place; output is unchanged.

        Returns, per sliced parameter, the ``(dim, index)`` slices applied in order, so optimizer
        state can be sliced the same way. If any bond has no survivor the table is zero and
        every internal bond drops to rank 0.
        """
        applied = shrink_chain_(list(self.cores), list(self.gates), self.gate_threshold)
        self._plan = None
        return applied

    def fold_gates_(self) -> None:
        """Multiply ``mu(g_k)`` into core ``k``'s last index and reset the gates to 1.

        Dead entries leave zero slices that count as active afterwards: ``shrink_`` first.
        """
        fold_gates_chain_(list(self.cores), list(self.gates), self.gate_threshold)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, row_modes={list(self.row_modes)}, "
            f"col_modes={list(self.col_modes)}, ranks={list(self.ranks)}, "
            f"params={self.num_parameters()}, compression={self.compression_ratio():.1f}x"
            + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")
            + (f", kernel={self.kernel.value}" if self.kernel is not KernelPref.AUTO else "")
        )
