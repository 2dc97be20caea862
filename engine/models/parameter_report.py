"""Parameter counts of a (possibly tensorized) model: :func:`parameter_report`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding

__all__ = ["ParameterReport", "parameter_report"]


@dataclass(frozen=True)
class ParameterReport:
    """Parameter counts of a (possibly tensorized) model; ``other`` includes TT biases."""

    total: int
    tt_cores: int  # TT / TTM core entries
    gates: int  # rank-gate entries
    other: int  # everything else: dense layers, biases, LayerNorms, position embeddings
    tensorized_dense: int  # dense weight entries the TT / TTM layers stand in for
    tensorized_layers: int

    @property
    def tensorized_ratio(self) -> float:
        """Dense weight entries over core entries, tensorized layers only."""
        return math.inf if self.tt_cores == 0 else self.tensorized_dense / self.tt_cores

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["tensorized_ratio"] = self.tensorized_ratio
        return out


def parameter_report(model: nn.Module) -> ParameterReport:
    """Exact counts for any model holding ``TTLinear`` / ``TTMEmbedding`` modules."""
    total = sum(p.numel() for p in model.parameters())
    tt = [m for m in model.modules() if isinstance(m, TTLinear | TTMEmbedding)]
    cores = sum(p.numel() for m in tt for p in m.cores)
    gates = sum(p.numel() for m in tt for p in m.gates)
    return ParameterReport(
        total=total,
        tt_cores=cores,
        gates=gates,
        other=total - cores - gates,
        tensorized_dense=sum(m.dense_parameters() for m in tt),
        tensorized_layers=len(tt),
    )
