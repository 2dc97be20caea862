"""Physical rank shrinking of a whole model, with the optimizer state following
(docs/method.md#physical-shrinking).

:func:`shrink_model_` slices every tensorized layer whose active ranks (gates above ``tau``) fall
short of its stored ranks: dead gate entries, and the core slices they mask, are removed in place
(``p.data = ...``, so the optimizer keeps the same ``Parameter`` objects), and every per-parameter
optimizer state tensor shaped like its parameter (Adam moments) is sliced the same way. Surviving
gate values are left as they are. The network's output is unchanged, and so is the rest of an
AdamW trajectory: a dead entry gets zero gradient, so its slice never influences a live one.

Layers with nothing to cut are not touched. After a change, rebuild anything that cached shapes:
:meth:`engine.rank.penalty.GateIndex.refresh` and any captured CUDA graph. Never call this inside
a capture.

**Drop every autograd graph built before the shrink** (the last loss, logits, penalty: keep
``float(loss)`` or ``loss.detach()``, not ``loss``). While any such graph is alive, PyTorch reuses
each parameter's gradient accumulator with the *old* shape (``set_data`` resets it only on a dtype
or device change), and the next backward fails with "invalid gradient ... expected shape
compatible with [old shape]".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from engine.rank.size import tensorized_layers
from engine.tt.surgery import slice_optimizer_state_

__all__ = ["RankChange", "shrink_model_"]


@dataclass(frozen=True)
class RankChange:
    """Stored ranks ``(before, after)`` of every layer that was sliced (unchanged layers absent)."""

    per_layer: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    changed: bool = False

    def to_dict(self) -> dict:
        return {
            "changed": self.changed,
            "per_layer": {
                name: {"before": list(before), "after": list(after)}
                for name, (before, after) in self.per_layer.items()
            },
        }


def shrink_model_(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> RankChange:
    """Slice dead ranks out of every tensorized layer and ``optimizer``'s state (module doc)."""
    per_layer: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for name, layer in tensorized_layers(model):
        before = tuple(int(r) for r in layer.ranks)
        active = layer.active_ranks()
        if active == before:
            continue  # nothing to cut
        record = layer.shrink_()
        if optimizer is not None:
            slice_optimizer_state_(optimizer, record)
        after = tuple(int(r) for r in layer.ranks)
        if after != before:
            per_layer[name] = (before, after)
    return RankChange(per_layer=per_layer, changed=bool(per_layer))
