"""Keep TT-linear outputs for backward as their rank-r factor, and rebuild them on demand.

The fused TT-linear computes ``y = T R_b`` with ``T = [x L, 1]`` (B, r + 1) and
``R_b = [R; b]`` (r + 1, M), and saves ``T`` for its own backward anyway. Whoever consumes
``y`` and saves it for backward (the next linear, GELU, attention's ``q, k, v``) would
otherwise keep a (B, M) tensor alive until backward; here, inside
:func:`recompute_tt_outputs`, a saved-tensor hook stores ``(T, R_b)`` instead and the
tensor is rebuilt with one skinny GEMM when backward unpacks it: ``M / (r + 1)`` times less
memory (25x for M = 768, 99x for 3072) for one (B, r + 1) x (r + 1, M) product. This is the
tensor-train analogue of activation recomputation, at a fraction of its cost: nothing but
that product is recomputed.

Attention (:class:`engine.nn.attention.AttentionFunction`) joins in: inside the context it
saves its ``q, k, v`` as given (TT-linear outputs, so factors) rather than copies, and no
probabilities at all, rebuilding them in backward from ``q, k`` (one more ``q k^T`` and
softmax); only its one-byte dropout mask stays.

Outputs are tagged by :class:`~engine.contract.execute.TTLinearFunction` only while the
context is active and gradients are recorded; views of a tagged output (reshape, head split,
transpose) are rebuilt with the same strides. The value rebuilt is the one saved: backward
runs before the optimizer changes the cores, and ``T``, ``R_b`` are the forward's tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["recompute_tt_outputs", "recomputing", "tag_output"]

_ATTR = "_tt_lowrank_factors"
_depth = 0


def recomputing() -> bool:
    """Whether a :func:`recompute_tt_outputs` context is active."""
    return _depth > 0


def tag_output(y: Tensor, t1: Tensor, rb: Tensor) -> None:
    """Mark ``y = t1 @ rb`` as rebuildable (called by the TT-linear executor)."""
    setattr(y, _ATTR, (t1, rb))


class _Rebuild:
    """What a saved TT-linear output is replaced by: its factors and its view geometry."""

    __slots__ = ("t1", "rb", "size", "stride", "offset")

    def __init__(self, t1: Tensor, rb: Tensor, t: Tensor) -> None:
        self.t1, self.rb = t1, rb
        self.size, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()

    def tensor(self) -> Tensor:
        base = self.t1 @ self.rb  # (B, M) the tagged output
        return base.as_strided(self.size, self.stride, self.offset)


def _pack(t: Tensor) -> Tensor | _Rebuild:
    root = t._base if t._base is not None else t
    factors = getattr(root, _ATTR, None)
    if factors is None or t.untyped_storage().data_ptr() != root.untyped_storage().data_ptr():
        return t
    return _Rebuild(*factors, t)


def _unpack(saved: Tensor | _Rebuild) -> Tensor:
    return saved.tensor() if isinstance(saved, _Rebuild) else saved


@contextlib.contextmanager
def recompute_tt_outputs() -> Iterator[None]:
    """Within: TT-linear outputs saved for backward are kept as factors (module doc)."""
    global _depth
    _depth += 1
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            yield
    finally:
        _depth -= 1
