"""Physical rank surgery on a gated chain: slicing dead bonds and folding gates.

Both operations keep the layer's output unchanged. They mutate parameters in place
(``p.data = ...``) so an optimizer keeps referencing the same ``Parameter`` objects; the
returned index maps say how to slice optimizer state the same way. Never call these inside a
CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from engine.tt.cores import gate_mu

__all__ = ["SliceMap", "shrink_chain_", "fold_gates_chain_", "slice_optimizer_state_"]

# per parameter, the (dim, kept indices) slices applied in order
SliceMap = dict[nn.Parameter, list[tuple[int, Tensor]]]


def _slice_(p: nn.Parameter, dim: int, idx: Tensor, record: SliceMap) -> None:
    p.data = p.data.index_select(dim, idx)
    if p.grad is not None:
        p.grad = p.grad.index_select(dim, idx)
    record.setdefault(p, []).append((dim, idx))


@torch.no_grad()
def shrink_chain_(
    cores: Sequence[nn.Parameter], gates: Sequence[nn.Parameter], tau: float
) -> SliceMap:
    """Slice every bond to its gate entries above ``tau``; returns the slices applied.

    Bond ``k`` is the last dim of ``cores[k]``, the first dim of ``cores[k + 1]`` and all of
    ``gates[k]``. If any bond has no survivor the chain is identically zero and every
    internal bond is cut to rank 0. Surviving gate values are left as they are.
    """
    keeps = [torch.nonzero(g > tau).flatten() for g in gates]
    if any(k.numel() == 0 for k in keeps):
        keeps = [k[:0] for k in keeps]
    record: SliceMap = {}
    for k, (g, keep) in enumerate(zip(gates, keeps, strict=True)):
        if keep.numel() == g.numel():
            continue
        _slice_(cores[k], cores[k].dim() - 1, keep, record)
        _slice_(cores[k + 1], 0, keep, record)
        _slice_(g, 0, keep, record)
    return record


@torch.no_grad()
def fold_gates_chain_(
    cores: Sequence[nn.Parameter], gates: Sequence[nn.Parameter], tau: float
) -> None:
    """Multiply ``mu(g_k)`` into ``cores[k]`` and reset the gates to 1 (output unchanged)."""
    if tau >= 1.0:
        raise ValueError(f"gate_threshold {tau} >= 1: gates reset to 1 would be masked")
    for core, g in zip(cores, gates, strict=False):
        core.mul_(gate_mu(g, tau))
        g.fill_(1.0)


@torch.no_grad()
def slice_optimizer_state_(optimizer: torch.optim.Optimizer, record: SliceMap) -> None:
    """Slice every per-parameter state tensor shaped like its parameter (Adam moments)."""
    for p, slices in record.items():
        state = optimizer.state.get(p)
        if not state:
            continue
        for name, value in state.items():
            if not isinstance(value, Tensor) or value.dim() == 0:
                continue  # step counters and scalars
            for dim, idx in slices:
                value = value.index_select(dim, idx.to(value.device))
            state[name] = value
