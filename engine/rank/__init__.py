"""Rank adaptation for CoMERA training: size model, penalties, objectives, pruning, shrinking.

Public API::

    tensorized_layers, layer_mode_sizes,   the exact size model S (active ranks) and the stored
    layer_size, model_size, stored_size    core count (size.py)
    PENALTIES, GateIndex                   on-device penalty R, size S, active count (penalty.py)
    early_objective, late_switch,          stage objectives (objectives.py)
    late_objective
    PruneReport, prune_to_target_,         greedy pruning to meet S <= S* (prune.py)
    prune_plan
    RankChange, shrink_model_              physical slicing + optimizer state (shrink.py)
    rank_snapshot, compression_summary     JSON-safe logs (trajectory.py)
"""

from engine.rank.objectives import early_objective, late_objective, late_switch
from engine.rank.penalty import PENALTIES, GateIndex
from engine.rank.prune import PruneReport, prune_plan, prune_to_target_
from engine.rank.shrink import RankChange, shrink_model_
from engine.rank.size import (
    layer_mode_sizes,
    layer_size,
    model_size,
    stored_size,
    tensorized_layers,
)
from engine.rank.trajectory import compression_summary, rank_snapshot

__all__ = [
    "tensorized_layers",
    "layer_mode_sizes",
    "layer_size",
    "model_size",
    "stored_size",
    "PENALTIES",
    "GateIndex",
    "early_objective",
    "late_switch",
    "late_objective",
    "PruneReport",
    "prune_plan",
    "prune_to_target_",
    "RankChange",
    "shrink_model_",
    "rank_snapshot",
    "compression_summary",
]
